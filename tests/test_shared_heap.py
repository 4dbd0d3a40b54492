"""Forked workers keep sharing the loader's heap: neither a worker's garbage collection nor the loader's
process's own copies many of its pages while the workers run; the heap is unfrozen once they are gone."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch.utils.data

import loader

OBJECTS = 150_000  # tracked objects in the loader's process: ~35 MiB of small dicts


def dirty_kib(kind: str) -> int:
    """This process's ``Private_Dirty`` or ``Shared_Dirty`` memory (KiB)."""
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(f"{kind}_Dirty:"))


class CollectOnce(torch.utils.data.Dataset):
    """One item, read in a worker: the worker's freeze count, and what one full collection there made it
    copy of its parent's pages (KiB)."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> tuple[int, int]:
        before = dirty_kib("Private")
        gc.collect()
        return gc.get_freeze_count(), dirty_kib("Private") - before


def in_worker(make_loader) -> tuple[int, int]:
    heap = [{"n": n} for n in range(OBJECTS)]  # the job's objects, made before the workers fork
    dl = make_loader(CollectOnce(), batch_size=None, num_workers=1, multiprocessing_context="fork")
    (frozen, copied_kib), *_ = list(dl)
    assert len(heap) == OBJECTS
    return frozen, copied_kib


@pytest.mark.multiproc
def test_a_workers_collection_copies_little_of_the_loaders_heap_where_torchs_copies_it():
    torch_frozen, torch_copied = in_worker(torch.utils.data.DataLoader)
    ours_frozen, ours_copied = in_worker(loader.DataLoader)
    assert torch_frozen == 0 and torch_copied > 20 * 1024  # every page holding one of the dicts
    assert ours_frozen > OBJECTS and ours_copied < torch_copied / 4
    assert gc.get_freeze_count() == 0  # the loader's process collects its objects as before


@pytest.mark.multiproc
def test_a_process_that_froze_its_heap_itself_is_left_as_it_is():
    gc.freeze()
    frozen = gc.get_freeze_count()
    try:
        dl = loader.DataLoader(CollectOnce(), batch_size=None, num_workers=1, multiprocessing_context="fork")
        list(dl)
        assert 0 < gc.get_freeze_count() <= frozen  # not unfrozen, nothing more frozen (some freed)
    finally:
        gc.unfreeze()


def shared_after_collection_kib(make_loader) -> tuple[int, int]:
    """With a persistent worker running: the freeze count here, and what this process still shares with it
    after a full collection here (KiB). Lists, which the collector always examines (a dict of ints is
    untracked by the first collection that sees it)."""
    heap = [[n] for n in range(OBJECTS)]
    dl = make_loader(CollectOnce(), batch_size=None, num_workers=1, multiprocessing_context="fork",
                     persistent_workers=True)  # fmt: skip
    list(dl)  # the worker runs on
    gc.collect()
    frozen, shared = gc.get_freeze_count(), dirty_kib("Shared")
    del dl
    assert len(heap) == OBJECTS
    return frozen, shared


@pytest.mark.multiproc
def test_while_workers_run_the_loaders_own_collections_leave_its_heap_shared_where_torchs_copy_it():
    torch_frozen, torch_shared = shared_after_collection_kib(torch.utils.data.DataLoader)
    ours_frozen, ours_shared = shared_after_collection_kib(loader.DataLoader)
    assert torch_frozen == 0 and ours_frozen > OBJECTS
    assert ours_shared > torch_shared + 8 * 1024  # the pages holding the lists (~11 MiB) are still shared
    gc.collect()
    assert gc.get_freeze_count() == 0  # the workers are gone: unfrozen


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.mark.multiproc
def test_the_heap_stays_frozen_until_the_last_workers_end_then_its_cycles_are_collected():
    kept = Cycle()
    gone = weakref.ref(kept)
    options = dict(batch_size=None, num_workers=1, multiprocessing_context="fork", persistent_workers=True)
    train, evaluation = (
        loader.DataLoader(CollectOnce(), **options),
        loader.DataLoader(CollectOnce(), **options),
    )
    list(train), list(evaluation)
    del kept  # garbage in a cycle made before the workers forked: frozen, not collected while they run
    gc.collect()
    assert gc.get_freeze_count() > 0 and gone() is not None
    del train
    gc.collect()
    assert gc.get_freeze_count() > 0 and gone() is not None  # the evaluation loader's worker still runs
    del evaluation
    gc.collect()
    assert gc.get_freeze_count() == 0 and gone() is None
