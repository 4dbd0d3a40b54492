"""Useful work: counted on hand-made batches, summed per epoch by the job, reported beside the epoch time."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from loader.packing import ALGORITHMS, PackingCollator
from stallbench.analysis.results import EpochRecord
from stallbench.analysis.work import useful_work
from stallbench.batches import TokenCount, batch_samples, batch_tokens
from stallbench.compute import parse_compute
from stallbench.energy import ESTIMATE, ESTIMATE_WATTS_PER_CORE
from stallbench.jobs.batching import SeenIndices, packs_per_step, pad_tokens, token_batching
from stallbench.jobs.spec import PACKINGS, WorkloadJob


def _examples(*lengths: int) -> list[tuple[torch.Tensor, None]]:
    return [(torch.arange(1, n + 1), None) for n in lengths]


def test_a_padded_batch_counts_its_padding():
    batch = pad_tokens(_examples(3, 5, 1))
    assert batch[0].shape == (3, 5)
    assert batch_tokens(batch) == TokenCount(valid=9, slots=15) and batch_samples(batch) == 3


def test_a_packed_batch_is_all_valid_tokens():
    batch = PackingCollator(16, block_mask=False)(_examples(3, 5, 1))
    assert batch_tokens(batch) == TokenCount(valid=9, slots=9) and batch_samples(batch) == 3


@pytest.mark.parametrize(
    "batch", [(torch.zeros(4, 3, 8, 8), torch.arange(4)), torch.zeros(4, 7), {"input_ids": torch.zeros(1, 4)}]
)
def test_other_batches_have_no_token_counts(batch):
    assert batch_tokens(batch) is None


def test_packing_names_are_the_loaders_algorithms():
    assert set(PACKINGS) == set(ALGORITHMS)
    with pytest.raises(ValueError, match="max_len"):
        WorkloadJob("torch", "t.arrow", packing="ffd")
    with pytest.raises(ValueError, match="packing must be"):
        WorkloadJob("torch", "t.arrow", packing="best", max_len=8)


def test_seen_indices_counts_each_pass_apart():
    seen = SeenIndices([[0, 1], [1, 2], [3]])
    assert list(seen) == [[0, 1], [1, 2], [3]] and seen.unique == 4 and len(seen) == 3
    it = iter(seen)
    next(it)
    assert seen.unique == 2  # a new pass starts afresh


class LengthsOnly(torch.utils.data.Dataset):
    """Examples of the given lengths, all zeros."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, None]:
        return torch.zeros(int(self.lengths[index]), dtype=torch.int64), None


def _job(**options) -> WorkloadJob:
    return WorkloadJob("torch", "t.arrow", batch_size=4, **options)


def test_padded_batching_hands_out_every_example_once():
    lengths = np.array([5, 1, 7, 3, 2, 2, 9, 4, 6, 8])
    options = token_batching(lengths, _job(), torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(LengthsOnly(lengths), **options)
    batches = list(loader)
    seen = loader.batch_sampler
    assert isinstance(seen, SeenIndices) and seen.unique == 10 and len(batches) == 3
    assert sum(batch_tokens(b).valid for b in batches) == lengths.sum()
    assert all(batch_tokens(b).slots == b[0].numel() for b in batches)


def test_packed_steps_carry_the_token_slots_of_a_padded_step_and_count_the_room_left():
    lengths = np.array([5, 1, 7, 3, 2, 2, 9, 4, 6, 8])
    padded = list(torch.utils.data.DataLoader(LengthsOnly(lengths), **token_batching(lengths, _job(), None)))
    padded_slots = np.mean([batch_tokens(b).slots for b in padded])  # 4 examples padded to the longest
    per_step = packs_per_step(lengths, 4, 10)
    assert per_step >= 2 and abs(per_step * 10 - padded_slots) <= 10  # within a pack of a padded step
    full = token_batching(lengths, _job(packing="ffd", max_len=10), torch.Generator())
    steps = list(torch.utils.data.DataLoader(LengthsOnly(lengths), **full))
    assert sum(batch_tokens(s, per_step * 10).valid for s in steps) == lengths.sum() == 47
    assert len(steps) == -(-5 // per_step)  # ffd's 5 packs (the fewest: 47 / 10), per_step a step
    assert all(batch_tokens(s, per_step * 10).slots == per_step * 10 for s in steps)  # the room, used or not
    assert all(s["input_ids"].shape[1] <= per_step * 10 for s in steps)


def test_a_group_member_does_not_count_unique_examples():
    options = token_batching(np.array([1, 2, 3]), _job(coordinate="g"), torch.Generator())
    assert not isinstance(options["batch_sampler"], SeenIndices)


def test_token_compute_costs_per_slot_padding_included():
    step = parse_compute("emulated-tokens:2")  # 2 ms per 1,000 slots
    padded = (torch.zeros(10, 5_000, dtype=torch.int64), torch.full((10,), 500))  # 50,000 slots, 5,000 valid
    start = time.perf_counter()
    step(padded)
    assert time.perf_counter() - start >= 0.1 and step.name == "emulated-tokens:2"
    with pytest.raises(ValueError, match="needs token batches"):
        step((torch.zeros(2, 3, 4, 4), torch.arange(2)))
    with pytest.raises(ValueError, match=r"emulated-tokens:0\.5"):
        parse_compute("emulated-tokens:-1")


def _epoch(e: int, seconds: float, **counts) -> EpochRecord:
    base = dict(wait_seconds=0.0, step_seconds=0.0, first_batch_seconds=0.0, storage_bytes=0)
    return EpochRecord(e, seconds, **base, **counts)


def test_useful_work_is_per_steady_epoch_and_per_second():
    epochs = [
        _epoch(2, 2.0, batches=10, samples=40, valid_tokens=800, token_slots=1000, unique_samples=40,
               cpu_seconds=1.0),
        _epoch(3, 2.0, batches=10, samples=40, valid_tokens=800, token_slots=1000, unique_samples=40,
               cpu_seconds=3.0),
    ]  # fmt: skip
    work = useful_work(epochs, "ffd", 512)
    assert (work.packing, work.pack_len, work.updates, work.updates_per_s) == ("ffd", 512, 10, 5.0)
    assert (work.valid_tokens_per_s, work.token_slots_per_s) == (400.0, 500.0)
    assert work.padding_fraction == pytest.approx(0.2) and work.unique_samples == 40
    assert work.energy_source == ESTIMATE and work.energy_joules == 2.0 * ESTIMATE_WATTS_PER_CORE
    assert work.joules_per_1k_tokens == pytest.approx(25.0) and work.joules_per_sample == pytest.approx(0.5)


def test_measured_energy_is_used_where_every_epoch_has_it():
    epochs = [_epoch(2, 1.0, batches=1, samples=4, energy_joules=j, energy_source="rapl") for j in (3.0, 5.0)]
    work = useful_work(epochs)
    assert (work.energy_joules, work.energy_source) == (4.0, "rapl")
    assert work.valid_tokens is None and work.joules_per_1k_tokens is None and work.unique_samples is None


def test_updates_are_the_optimizer_steps_where_counted_else_the_batches():
    epoch = dict(epoch=2, seconds=2.0, wait_seconds=0.5, step_seconds=1.5, first_batch_seconds=0.1)
    epoch |= dict(samples=40, storage_bytes=0)
    stepped = [EpochRecord(**epoch, batches=10, optimizer_steps=n) for n in (2, 3)]
    assert useful_work(stepped).updates == 2.5 and useful_work(stepped).updates_per_s == 1.25
    unstepped = [EpochRecord(**epoch, batches=10)]
    assert useful_work(unstepped).updates == 10


def test_a_wrapper_whose_step_steps_its_optimizer_is_one_update():
    """accelerate's AcceleratedOptimizer.step calls its optimizer's: torch's hooks fire for both."""
    from stallbench.jobs._updates import optimizer_steps, watch_optimizers

    class Wrapper(torch.optim.SGD):
        def __init__(self, inner: torch.optim.Optimizer) -> None:
            super().__init__([torch.zeros(1, requires_grad=True)], lr=0.1)
            self.inner = inner

        def step(self, closure=None):
            return self.inner.step(closure)

    watch_optimizers()
    inner = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    before = optimizer_steps() or 0
    Wrapper(inner).step()
    inner.step()
    assert optimizer_steps() - before == 2
