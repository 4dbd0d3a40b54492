"""What stallbench.profile costs a training loop: the same loop bare and profiled, alternating in one run.

The loop is a torch DataLoader over a TensorDataset (no workers) with a CPU step of about 0.7 ms (four
256x256 matmuls on one thread). Each benchmark round runs one bare epoch and one profiled epoch, in an
order that alternates round by round, so drift on a shared machine hits both alike. The assertion takes
the median over rounds of bare time / profiled time of the same round (the ratio of the two medians is
printed too; on a busy shared machine it swings by a few percent from load alone). A second group times
an empty loop, to show the cost per iteration by itself.

    python -m pytest -p no:cacheprovider --benchmark-enable benchmarks/bench_profile.py -s
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from stallbench.profile import profile

ROUNDS = 40  # short epochs, many alternating rounds: pairs close in time see the same machine load
BATCHES, BATCH_SIZE, WIDTH = 50, 64, 256
EMPTY_LOOP = 200_000
MIN_RATIO = 0.98  # profiled throughput / bare throughput
MAX_NS_PER_ITERATION = 5_000


@pytest.fixture
def one_thread():
    """One intra-op thread: steadier step times on a small shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _epoch(loop: Iterable[Any], step: Callable[[Any], object]) -> float:
    start = time.perf_counter()
    for batch in loop:
        step(batch)
    return time.perf_counter() - start


def _alternate(benchmark, loops: dict[str, Iterable[Any]], step: Callable[[Any], object]) -> dict:
    """Benchmark rounds of one epoch per mode, alternating which goes first; seconds per mode."""
    times: dict[str, list[float]] = {mode: [] for mode in loops}

    def pair() -> None:
        order = list(loops) if len(times["bare"]) % 2 == 0 else list(loops)[::-1]
        for mode in order:
            times[mode].append(_epoch(loops[mode], step))

    for loop in loops.values():  # warm-up, untimed: allocator, first-call paths
        _epoch(loop, step)
    benchmark.pedantic(pair, rounds=ROUNDS, iterations=1)
    return times


def _report(benchmark, times: dict[str, list[float]], what: str) -> float:
    """Print both medians; return the median over rounds of bare time / profiled time."""
    bare, profiled = statistics.median(times["bare"]), statistics.median(times["profiled"])
    paired = statistics.median(b / p for b, p in zip(times["bare"], times["profiled"], strict=True))
    ratio = bare / profiled
    benchmark.extra_info.update(
        bare_s=times["bare"], profiled_s=times["profiled"], ratio=ratio, paired=paired
    )
    print(
        f"\n{what}: bare median {bare * 1e3:.2f} ms, profiled median {profiled * 1e3:.2f} ms, "
        f"ratio of medians {ratio:.4f}, median of paired rounds {paired:.4f}"
    )
    return paired


def test_profile_overhead_on_a_training_loop(benchmark, one_thread) -> None:
    loader = DataLoader(TensorDataset(torch.randn(BATCHES * BATCH_SIZE, WIDTH)), batch_size=BATCH_SIZE)
    weight = torch.randn(WIDTH, WIDTH) / WIDTH**0.5
    prof = profile(loader, name="bench")

    def step(batch: list[torch.Tensor]) -> None:
        hidden = batch[0] @ weight
        for _ in range(3):
            hidden = torch.tanh(weight @ hidden.T).T
        hidden.sum().item()

    benchmark.group = "profile-overhead"
    times = _alternate(benchmark, {"bare": loader, "profiled": prof}, step)
    ratio = _report(benchmark, times, f"{BATCHES} batches, ~0.7 ms CPU step")
    assert prof.to_dict()["steady"]["iterations"] == (ROUNDS + 1) * (BATCHES - 1)
    assert ratio >= MIN_RATIO, f"profiled throughput {ratio:.4f} of bare, below {MIN_RATIO}"


def test_profile_cost_per_iteration(benchmark) -> None:
    items = range(EMPTY_LOOP)
    benchmark.group = "profile-per-iteration"
    times = _alternate(benchmark, {"bare": items, "profiled": profile(items)}, lambda batch: None)
    _report(benchmark, times, f"empty loop of {EMPTY_LOOP} items")
    per_iteration = (statistics.median(times["profiled"]) - statistics.median(times["bare"])) / EMPTY_LOOP
    benchmark.extra_info["ns_per_iteration"] = per_iteration * 1e9
    print(f"profile cost: {per_iteration * 1e9:.0f} ns per iteration")
    assert per_iteration * 1e9 < MAX_NS_PER_ITERATION
