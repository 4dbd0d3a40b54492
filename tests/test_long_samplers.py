"""Samplers that never end or list millions of indices: the first batch at once, memory independent of the
sampler's length, and resume exact (the position is kept, not the order), against torch's class."""

from __future__ import annotations

import itertools
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from _endless_job import Endless, Moving, Squares, StatefulBatches, StatefulIndices
from _job_batch import OUT, STATE, Restarts

from loader import DataLoader

JOB = Path(__file__).with_name("_endless_job.py")
LOADERS = [torch.utils.data.DataLoader, DataLoader]
RESUMED_WORKERS, RESUMED_AT = [0, 2], [0, 7]
KINDS = ["sampler", "stateful-batches", "stateful-sampler", "moving-sampler"]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_endless_sampler_gives_torch_s_batches_at_once(workers):
    taken = {}
    for cls in LOADERS:
        dl = cls(Squares(), sampler=Endless(3), batch_size=5, num_workers=workers)
        taken[cls] = [batch.tolist() for batch in itertools.islice(dl, 20)]
    assert taken[DataLoader] == taken[torch.utils.data.DataLoader]
    assert len(taken[DataLoader]) == 20


@pytest.mark.parametrize("workers", [0, 2])
def test_an_endless_stateful_batch_sampler_gives_torch_s_batches_at_once(workers):
    """Issue 50: listing such a sampler's epoch before the first batch ran out of memory."""
    taken = {}
    for cls in LOADERS:
        dl = cls(Squares(), batch_sampler=StatefulBatches(1000, seed=3), num_workers=workers)
        taken[cls] = [batch.tolist() for batch in itertools.islice(dl, 20)]
    assert taken[DataLoader] == taken[torch.utils.data.DataLoader]
    assert len(taken[DataLoader]) == 20


def test_a_stateful_sampler_costs_what_it_costs_with_torch_s_class():
    peaks = {}
    for cls in LOADERS:
        tracemalloc.start()
        dl = cls(Many(), batch_sampler=torch.utils.data.BatchSampler(StatefulIndices(len(Many())), 4, False))
        next(iter(dl))
        peaks[cls] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[DataLoader] < peaks[torch.utils.data.DataLoader] + (1 << 20)


def test_a_moving_sampler_state_keeps_only_the_batches_drawn_ahead():
    """A sampler whose state is its position is saved as it is now, with the batches its workers asked for
    ahead of use: those, not every batch drawn so far."""
    dl = DataLoader(Squares(), sampler=Moving(1000), batch_size=5, num_workers=2, prefetch_factor=2)
    it = iter(dl)
    handed = [next(it) for _ in range(150)]
    own = dl.state_dict()["draw_states"]["sampler_states"]
    ahead = own["ahead"]
    assert 1 <= len(ahead) <= 2 * 2 + 1
    assert own["now"]["sampler"]["yielded"] == 5 * (len(handed) + len(ahead))
    assert [b.tolist() for b in itertools.islice(it, len(ahead))] == [[i * i for i in b] for b in ahead]


def test_a_state_saved_by_the_last_version_still_resumes():
    """Version 3 kept a stateful sampler's whole order; such a checkpoint resumes at its position."""
    order = [[7, 1], [3, 5], [0, 2], [9, 4]]
    state = DataLoader(Squares(), batch_size=2).state_dict()
    state.update(version=3, draw_states={"order": order, "torch": torch.get_rng_state()}, batches_delivered=1)
    dl = DataLoader(Squares(), batch_sampler=StatefulBatches(1000))
    dl.load_state_dict(state)
    assert [b.tolist() for b in dl] == [[i * i for i in b] for b in order[1:]]


def test_a_sampler_whose_own_state_dict_fails_costs_the_state_not_the_epoch():
    class Unsaveable(StatefulIndices):
        def state_dict(self) -> dict[str, int]:
            raise RuntimeError("not now")

    dl = DataLoader(Squares(), sampler=Unsaveable(1000), batch_size=5)
    it = iter(dl)
    assert [len(next(it)) for _ in range(3)] == [5, 5, 5]
    with pytest.raises(ValueError, match=r"sampler's own state_dict\(\) failed .*RuntimeError: not now"):
        dl.state_dict()


def test_a_state_naming_a_sampler_this_loader_lacks_is_refused():
    saved = DataLoader(Squares(), sampler=StatefulIndices(1000), batch_size=5)
    next(iter(saved))
    plain = DataLoader(Squares(), sampler=Endless(3), batch_size=5)
    with pytest.raises(ValueError, match=r"own state_dict\(\) of the saved loader's sampler"):
        plain.load_state_dict(saved.state_dict())


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
    for kind, workers, at in itertools.product(KINDS, RESUMED_WORKERS, RESUMED_AT):
        restarts.add(
            f"{kind}-{workers}-at-{at}",
            save=[STATE, OUT, kind, workers, at],
            load=[STATE, OUT, kind, workers],
        )
    return restarts


@pytest.mark.multiproc
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("workers", RESUMED_WORKERS)
@pytest.mark.parametrize("at", RESUMED_AT)
def test_an_endless_sampler_resumes_exactly_in_a_new_process(restarts, kind, workers, at):
    went_on, again = restarts.outcome(f"{kind}-{workers}-at-{at}")
    assert len(again) == 12 and again == went_on
