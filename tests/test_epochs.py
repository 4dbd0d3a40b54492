"""The generated jobs' loop (``stallbench.jobs.workload``): the ingestion run's batches travel and are
freed as real ones are.

Every run measures its step from a batch's arrival to the next ``__next__``, which includes freeing the
previous batch; for a batch a worker sent through shared memory that is real work. The ingestion run must
pay it too, or it moves from compute to stall.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from stallbench.jobs.data import make_loader
from stallbench.jobs.spec import WorkloadJob
from stallbench.jobs.workload import ingestion_loader, run_epochs
from tests.helpers import make_jpeg_folder

pytestmark = pytest.mark.multiproc


class _Images(Dataset):
    """``n`` uint8 images of ``side`` x ``side``, image i filled with i % 250, label i."""

    def __init__(self, n: int, side: int) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, self.side, self.side), i % 250, dtype=torch.uint8), i


def _real(n: int = 40, side: int = 32, batch: int = 8) -> DataLoader:
    return DataLoader(_Images(n, side), batch_size=batch, num_workers=2, persistent_workers=True)


class _SlowToClose:
    """Batches 0, 1, ... from an iterator that takes ``close_s`` to close, as a loader's iterator takes to
    shut its workers down."""

    def __init__(self, close_s: float) -> None:
        self.close_s = close_s

    def __iter__(self):
        try:
            yield from range(100)
        finally:
            time.sleep(self.close_s)


def test_an_epoch_cut_at_max_batches_ends_before_its_loader_shuts_down():
    """A script's ``--steps`` epoch ends at its last step; the workers' shutdown after it is no one's."""
    records = list(run_epochs(_SlowToClose(0.5), epochs=2, max_batches=3))
    assert [r["batches"] for r in records] == [3, 3]
    assert [r["seconds"] < 0.25 for r in records] == [True, True], records


def test_max_batches_takes_the_head_of_the_whole_order_with_workers_that_end_with_the_epoch(tmp_path: Path):
    """As a script's ``break`` after N steps: the workers are busy to the last step (an order of exactly N
    batches would leave them idle through the last ones) and shut down at the epoch's end."""
    data = make_jpeg_folder(tmp_path / "jpegs", per_class=8, classes=2)  # 16 images
    whole, _ = make_loader(WorkloadJob("torch", data, workers=2, batch_size=4), None)
    cut, _ = make_loader(WorkloadJob("torch", data, workers=2, batch_size=4, max_batches=2), None)
    assert (len(whole), whole.persistent_workers) == (4, True)
    assert (len(cut), cut.persistent_workers) == (4, False)
    records = list(run_epochs(cut, epochs=2, max_batches=2))
    assert [(r["batches"], r["samples"]) for r in records] == [(2, 8), (2, 8)]


def test_ingestion_batches_are_fresh_shared_memory_copies_of_the_first():
    real = _real()
    batches = list(ingestion_loader(real, workers=2))  # all held at once: each must have its own memory
    first = next(iter(real))
    assert len(batches) == len(real) == 5
    for images, labels in batches:
        assert torch.equal(images, first[0]) and torch.equal(labels, first[1])
        assert images.is_shared()
    assert len({images.untyped_storage().data_ptr() for images, _ in batches}) == 5


def test_ingestion_without_workers_hands_out_the_batch_itself():
    batches = list(ingestion_loader(_real(), workers=0, max_batches=3))
    assert len(batches) == 3
    assert len({images.untyped_storage().data_ptr() for images, _ in batches}) == 1


@pytest.mark.slow
def test_the_ingestion_runs_step_frees_a_batch_as_the_real_runs_step_does():
    """No compute: a step is only the loop, and freeing the previous 9.6 MB batch (~1 ms where it is a
    worker's shared memory, microseconds where the same batch comes back)."""
    real = _real(n=64 * 20, side=224, batch=64)
    steps = {}
    for name, dl in (("real", real), ("ingestion", ingestion_loader(real, workers=2))):
        epochs = list(run_epochs(dl, 3))[1:]
        steps[name] = sum(e["step_seconds"] for e in epochs) / sum(e["batches"] for e in epochs)
    assert steps["ingestion"] > 0.4 * steps["real"] > 0, steps
