"""Samplers that never end or list millions of indices: the first batch at once, memory independent of the
sampler's length, and resume exact (the position is kept, not the order), against torch's class."""

from __future__ import annotations

import itertools
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from _endless_job import Endless, Squares
from _job_batch import OUT, STATE, Restarts

from loader import DataLoader

JOB = Path(__file__).with_name("_endless_job.py")
LOADERS = [torch.utils.data.DataLoader, DataLoader]
RESUMED_WORKERS, RESUMED_AT = [0, 2], [0, 7]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_endless_sampler_gives_torch_s_batches_at_once(workers):
    taken = {}
    for cls in LOADERS:
        dl = cls(Squares(), sampler=Endless(3), batch_size=5, num_workers=workers)
        taken[cls] = [batch.tolist() for batch in itertools.islice(dl, 20)]
    assert taken[DataLoader] == taken[torch.utils.data.DataLoader]
    assert len(taken[DataLoader]) == 20


class Many(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2_000_000

    def __getitem__(self, i: int) -> int:
        return i


def first_batch_cost(cls: type) -> tuple[float, int]:
    """Seconds and the peak of Python's allocations until the first batch of a 2M-index epoch."""
    tracemalloc.start()
    start = time.perf_counter()
    next(iter(cls(Many(), batch_size=4)))
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak


def test_a_long_sampler_costs_what_it_costs_with_torch_s_class():
    (_, torch_peak), (_, our_peak) = (first_batch_cost(cls) for cls in LOADERS)
    assert our_peak < torch_peak + (1 << 20)  # listing 500,000 batches of 4 took ~60 MB here


@pytest.fixture(scope="module")
def restarts(tmp_path_factory) -> Restarts:
    """Every resume case below, each with a loader of its own: saved by one new process, restored by
    another."""
    restarts = Restarts(JOB, tmp_path_factory.mktemp("endless"), timeout=120)
    for workers, at in itertools.product(RESUMED_WORKERS, RESUMED_AT):
        restarts.add(f"{workers}-at-{at}", save=[STATE, OUT, workers, at], load=[STATE, OUT, workers])
    return restarts


@pytest.mark.multiproc
@pytest.mark.parametrize("workers", RESUMED_WORKERS)
@pytest.mark.parametrize("at", RESUMED_AT)
def test_an_endless_sampler_resumes_exactly_in_a_new_process(restarts, workers, at):
    went_on, again = restarts.outcome(f"{workers}-at-{at}")
    assert len(again) == 12 and again == went_on
