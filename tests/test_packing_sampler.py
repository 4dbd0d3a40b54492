"""PackedBatchSampler: every example once per epoch, a new random order each epoch from the seed, packs as
full as the algorithm made them, and a state that gives exactly the rest of the epoch."""

from __future__ import annotations

import numpy as np
import pytest

from loader.packing import ALGORITHMS, PackedBatchSampler, pack

MAX_LEN = 128


def lengths(count: int = 600, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(24), 0.9, count)), 1, MAX_LEN).astype(np.int64)


def shapes(packs: list[list[int]], sizes: np.ndarray) -> list[list[int]]:
    """Each pack's lengths, sorted: what the packs are, whichever examples fill them."""
    return sorted(sorted(sizes[p].tolist()) for p in packs)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("shuffle", [True, False])
def test_each_epoch_holds_every_example_once(algorithm, shuffle):
    sizes = lengths()
    sampler = PackedBatchSampler(sizes, MAX_LEN, algorithm=algorithm, shuffle=shuffle)
    for epoch in range(3):
        packs = list(sampler)
        assert sampler.epoch == epoch and len(packs) == len(sampler)
        assert sorted(i for p in packs for i in p) == list(range(len(sizes)))
        assert all(sizes[p].sum() <= MAX_LEN for p in packs)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_each_epoch_draws_a_new_order_from_the_seed(algorithm):
    sizes = lengths()
    first = PackedBatchSampler(sizes, MAX_LEN, algorithm=algorithm, seed=1)
    again = PackedBatchSampler(sizes, MAX_LEN, algorithm=algorithm, seed=1)
    other = PackedBatchSampler(sizes, MAX_LEN, algorithm=algorithm, seed=2)
    epochs = [list(first) for _ in range(3)]
    assert epochs == [list(again) for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2] and list(other) != epochs[0]


@pytest.mark.parametrize("algorithm", ["ffd", "spfhp"])
def test_shuffled_packs_are_the_algorithms_with_new_members(algorithm):
    sizes = lengths()
    packed = pack(sizes, MAX_LEN, algorithm)
    sampler = PackedBatchSampler(sizes, MAX_LEN, algorithm=algorithm)
    for _ in range(2):
        packs = list(sampler)
        assert shapes(packs, sizes) == shapes(packed, sizes)
        assert sorted(map(sorted, packs)) != sorted(map(sorted, packed))


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_without_shuffle_the_packs_are_packs_own(algorithm):
    sizes = lengths()
    sampler = PackedBatchSampler(sizes, MAX_LEN, algorithm=algorithm, shuffle=False)
    assert list(sampler) == list(sampler) == pack(sizes, MAX_LEN, algorithm)


def test_set_epoch_pins_the_epoch():
    sizes = lengths()
    walked = PackedBatchSampler(sizes, MAX_LEN)
    epochs = [list(walked) for _ in range(5)]
    pinned = PackedBatchSampler(sizes, MAX_LEN)
    pinned.set_epoch(3)
    assert list(pinned) == epochs[3]
    pinned.set_epoch(3)
    assert list(pinned) == epochs[3] and pinned.epoch == 3
    assert list(pinned) == epochs[4]  # then it walks on


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("at", [0, 7, "end"])
@pytest.mark.parametrize("set_epoch", [True, False])
def test_a_loaded_state_gives_the_rest_of_the_epoch_then_the_next(algorithm, at, set_epoch):
    sizes = lengths()
    saved = PackedBatchSampler(sizes, MAX_LEN, algorithm=algorithm)
    list(saved)
    it = iter(saved)
    at = len(saved) if at == "end" else at
    for _ in range(at):
        next(it)
    state = saved.state_dict()
    if at:  # the pass begins at its first pack: before it, the state is the end of the last
        assert (state["epoch"], state["position"]) == (1, at)
    went_on = list(it) + list(saved)
    restored = PackedBatchSampler(sizes, MAX_LEN, algorithm=algorithm)
    restored.load_state_dict(state)
    mid_epoch = at < len(saved)
    if set_epoch:  # a loop that calls set_epoch each epoch resumes as well
        restored.set_epoch(1 if mid_epoch else 2)
    assert list(restored) + (list(restored) if mid_epoch else []) == went_on


def test_consumed_saves_fewer_packs_than_were_handed_out():
    sampler = PackedBatchSampler(lengths(), MAX_LEN)
    it = iter(sampler)
    packs = [next(it) for _ in range(6)]  # a loader with workers asked for 6, the loop used 4
    restored = PackedBatchSampler(lengths(), MAX_LEN)
    restored.load_state_dict(sampler.state_dict(consumed=4))
    assert list(restored)[:2] == packs[4:]
    with pytest.raises(ValueError, match=r"consumed must be in 0\.\.6"):
        sampler.state_dict(consumed=7)


def test_a_state_of_another_sampler_is_refused():
    state = PackedBatchSampler(lengths(), MAX_LEN, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"another sampler's; differs in .*'seed': \(1, 2\)"):
        PackedBatchSampler(lengths(), MAX_LEN, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"'examples': \(600, 599\)"):
        PackedBatchSampler(lengths()[:-1], MAX_LEN, seed=1).load_state_dict(state)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        PackedBatchSampler([1, 2], MAX_LEN, algorithm="best")
    with pytest.raises(ValueError, match="example 1 has 129 tokens"):
        PackedBatchSampler([1, 129], MAX_LEN)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        PackedBatchSampler([1, 2], MAX_LEN, seed=-1)
