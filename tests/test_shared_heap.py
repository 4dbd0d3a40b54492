"""Forked workers keep sharing the loader's heap: a worker's garbage collection copies few of its pages, and a
fork pins none of the C heap's free memory; the loader's process collects its objects as before, a loader
in a reference cycle included."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch.utils.data

import loader

libc = ctypes.CDLL(None)  # the test's own handle: the restypes set here stay here
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

OBJECTS = 150_000  # tracked objects in the loader's process: ~35 MiB of small dicts


def private_dirty_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))


def rss_anon_kib() -> int:
    """The anonymous pages this process maps, shared with another or not (KiB)."""
    with open("/proc/self/status") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


class CollectOnce(torch.utils.data.Dataset):
    """One item, read in a worker: the worker's freeze count, and what one full collection there made it
    copy of its parent's pages (KiB)."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> tuple[int, int]:
        before = private_dirty_kib()
        gc.collect()
        return gc.get_freeze_count(), private_dirty_kib() - before


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


class FirstAnon(torch.utils.data.Dataset):
    """One item, read in a worker: the anonymous memory it maps at its start (KiB)."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> int:
        return rss_anon_kib()


FREED_MIB = 64


def free_heap_then_fork(make_loader) -> tuple[int, int]:
    """(this process's anonymous memory with FREED_MIB of its C heap freed as a training step frees its
    buffers, a worker's forked then; KiB). Made with malloc itself: numpy serves small arrays from a cache
    of its own, and earlier tests in the process may have filled it."""
    freed, kept = [], []
    for _ in range(FREED_MIB * 10):
        freed.append(libc.malloc(100 * 1024))  # below glibc's mmap threshold: from the heap
        kept.append(libc.malloc(4096))  # live between the freed ones: the heap's top cannot shrink to them
        ctypes.memset(freed[-1], 1, 100 * 1024)
    for address in freed:
        libc.free(address)
    before = rss_anon_kib()
    try:
        dl = make_loader(FirstAnon(), batch_size=None, num_workers=1, multiprocessing_context="fork")
        (worker,) = list(dl)
    finally:
        for address in kept:
            libc.free(address)
    return before, worker


def forks_in_a_fresh_process() -> dict[str, tuple[int, int]]:
    """``free_heap_then_fork`` per loader, run in a new interpreter: how much of the freed heap torch's fork
    maps depends on the heap the process has, and the suite's process has the heap its earlier tests left
    (one mapped 36 MiB less of the 64 freed than a lone run)."""
    script = (
        "import json, torch.utils.data, loader, test_shared_heap as t; print(json.dumps({"
        "'torch': t.free_heap_then_fork(torch.utils.data.DataLoader), "
        "'ours': t.free_heap_then_fork(loader.DataLoader)}))"
    )
    tests = str(Path(__file__).parent)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return {name: tuple(pair) for name, pair in json.loads(done.stdout.splitlines()[-1]).items()}


@pytest.mark.multiproc
def test_a_fork_pins_none_of_the_heaps_free_memory_where_torchs_pins_it():
    forks = forks_in_a_fresh_process()
    (torch_before, torch_worker), (ours_before, ours_worker) = forks["torch"], forks["ours"]
    assert torch_worker > torch_before - FREED_MIB * 1024 / 4  # torch's worker maps the freed pages
    assert ours_worker < ours_before - FREED_MIB * 1024 / 2  # trimmed before the fork
    # against torch's worker forked the same way: the trim kept most of the freed memory out of ours
    assert (torch_worker - torch_before) - (ours_worker - ours_before) > FREED_MIB * 1024 / 2


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


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.multiproc
@pytest.mark.parametrize(
    "make_loader", [torch.utils.data.DataLoader, loader.DataLoader], ids=["torch", "ours"]
)
def test_a_loader_with_running_workers_dropped_in_a_reference_cycle_is_collected(make_loader):
    # kept frozen while the workers ran, the loader's own objects (made before the fork) were never
    # collected, so a dropped loader's workers lived on: keeping the heap frozen was tried and undone
    dl = make_loader(Numbers(), num_workers=1, persistent_workers=True, multiprocessing_context="fork")
    assert [int(batch) for batch in dl] == [0, 1, 2, 3]
    dl.me = dl  # a cycle, as a user's object graph may make one
    dropped = weakref.ref(dl)
    del dl
    gc.collect()
    assert dropped() is None and gc.get_freeze_count() == 0
