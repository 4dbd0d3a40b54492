"""pack() and packing_report(): every example once, no pack over max_len, and packs as full as promised."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from loader.packing import ALGORITHMS, pack, packing_report

MAX_LEN = 512


def lognormal_lengths(count: int, seed: int, median: float = 64, sigma: float = 1.04) -> np.ndarray:
    """A long tail, as text has: the workload's token lengths (median 64, clipped to 8..512) by default."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, count)), 8, MAX_LEN).astype(np.int64)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("count", [0, 1, 7, 2000])
def test_every_example_once_and_no_pack_over_max_len(algorithm, count):
    lengths = lognormal_lengths(count, seed=count)
    packs = pack(lengths, MAX_LEN, algorithm)
    assert sorted(i for p in packs for i in p) == list(range(count))
    assert all(p and lengths[p].sum() <= MAX_LEN for p in packs)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_examples_of_max_len_and_of_one_token(algorithm):
    packs = pack([4, 1, 4, 1, 1, 3], 4, algorithm)
    assert sorted(sorted(p) for p in packs) == (
        [[0], [1], [2], [3, 4], [5]] if algorithm == "nextfit" else [[0], [1, 5], [2], [3, 4]]
    )


def test_nextfit_keeps_the_order():
    lengths = lognormal_lengths(500, seed=3)
    packs = pack(lengths, MAX_LEN, "nextfit")
    assert [i for p in packs for i in p] == list(range(500))
    for this, following in itertools.pairwise(packs):  # a pack closes only when the next won't fit
        assert lengths[this].sum() + lengths[following[0]] > MAX_LEN


def test_ffd_is_first_fit_decreasing():
    # sorted: 6 6 5 4 3 2 2 at 10: 6 -> A, 6 -> B, 5 -> C, 4 -> A (first with room), 3 -> B, 2 -> C, 2 -> C
    assert pack([2, 5, 6, 3, 4, 6, 2], 10, "ffd") == [[2, 4], [5, 3], [1, 0, 6]]


@pytest.mark.parametrize("algorithm", ["ffd", "spfhp"])
@pytest.mark.parametrize(("median", "sigma"), [(64, 1.04), (40, 1.2), (120, 0.8), (20, 1.5)])
def test_efficiency_on_a_long_tail_at_512(algorithm, median, sigma):
    report = packing_report(lognormal_lengths(5000, seed=1, median=median, sigma=sigma), MAX_LEN, algorithm)
    assert report.efficiency >= 0.98, report
    assert report.packs >= report.fewest_packs


def test_the_report_counts_padding_before_and_after():
    report = packing_report([3, 5, 2, 6], 8, "ffd")  # packs: [6, 2], [5, 3]
    assert (report.examples, report.tokens, report.packs, report.fewest_packs) == (4, 16, 2, 2)
    assert report.padded_fraction == pytest.approx(1 - 16 / 32)
    assert report.efficiency == 1.0 and report.packed_fraction == 0.0
    empty = packing_report([], 8)
    assert (empty.padded_fraction, empty.efficiency) == (0.0, 1.0)


def test_an_example_over_max_len_is_named():
    with pytest.raises(ValueError, match=r"example 2 has 513 tokens and is longer than max_len=512"):
        pack([10, 512, 513, 600], MAX_LEN)


def test_an_empty_example_is_named():
    with pytest.raises(ValueError, match=r"example 1 has 0 tokens and is empty"):
        pack([10, 0], MAX_LEN)


def test_an_unknown_algorithm_lists_the_choices():
    with pytest.raises(
        ValueError, match=r"algorithm must be one of \['ffd', 'nextfit', 'spfhp'\], got 'bfd'"
    ):
        pack([1, 2], MAX_LEN, "bfd")


@pytest.mark.parametrize("lengths", [[1.5, 2.0], [[1, 2]], [True, False]])
def test_lengths_must_be_integers(lengths):
    with pytest.raises(ValueError, match="lengths must be a sequence of integers"):
        pack(lengths, MAX_LEN)


@pytest.mark.parametrize("max_len", [0, 2.5, None])
def test_max_len_must_be_positive(max_len):
    with pytest.raises(ValueError, match="max_len must be a positive number of tokens"):
        pack([1], max_len)
