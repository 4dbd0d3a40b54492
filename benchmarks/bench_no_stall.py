"""No stall added: with the data already in memory, loader.DataLoader moves batches as fast as torch's.

Two pairs, each its own benchmark group, 20,000 tiny samples in batches of 16 with 2 persistent workers:

* ``no-stall``: a TensorDataset, the same object for both loaders (ours then runs torch's machinery plus its
  own bookkeeping: resumable sampler, delivered-batch count);
* ``no-stall-warm-cache``: a SourceDataset over an in-memory source; ours reads every record from its warm
  MinIO cache in /dev/shm (and keeps its stats), torch's reads the source directly.

Rounds alternate between the two loaders in one run (each test's untimed setup runs one epoch of the other
loader, timed by hand), and the medians of batches per second are compared: ``no-stall`` must reach 0.97
of torch's rate; ``no-stall-warm-cache`` is reported.

    python -m pytest benchmarks/bench_no_stall.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

import loader
from loader.sources._fingerprint import digest
from stallbench.jobs.run import scratch_cache_dir
from stallbench.report import plain_table

NUM_SAMPLES, BATCH, WORKERS, ROUNDS = 20_000, 16, 2, 9
RECORD_BYTES = 64
# ours / torch, median batches per second. The warm-cache pair is reported, not asserted: ours does ~5 us
# more work per sample there (cache read, stats), and its ratio measured 0.91-1.04 on the 2-core machine.
MIN_RATIO = {"no-stall": 0.97, "no-stall-warm-cache": None}
KINDS = ("torch", "ours")


class MemorySource(loader.Source):
    """Records held in memory: reading one costs no I/O at all."""

    def __init__(self, records: list[bytes]) -> None:
        self.records = records
        self._fingerprint = digest(["memory", len(records), *records[:16]])

    def __len__(self) -> int:
        return len(self.records)

    def read(self, index: int) -> bytes:
        return self.records[index]

    def label(self, index: int) -> int:
        return index % 10

    def describe(self, index: int) -> str:
        return f"memory[{index}]"

    @property
    def fingerprint(self) -> str:
        return self._fingerprint


class Pair:
    """Both loaders of one comparison, warmed up, and every epoch's batches per second."""

    def __init__(self, name: str, loaders: dict[str, torch.utils.data.DataLoader]) -> None:
        self.name = name
        self.loaders = loaders
        self.rates: dict[str, list[float]] = {kind: [] for kind in loaders}
        for dl in loaders.values():
            sum(1 for _ in dl)  # starts the persistent workers (and fills a cache)

    def epoch(self, kind: str) -> None:
        start, batches = time.perf_counter(), sum(1 for _ in self.loaders[kind])
        self.rates[kind].append(batches / (time.perf_counter() - start))

    def ratio(self) -> float:
        return statistics.median(self.rates["ours"]) / statistics.median(self.rates["torch"])


def _loaders(name: str, cache_dir: Path) -> dict[str, torch.utils.data.DataLoader]:
    common = dict(batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True)
    if name == "no-stall":
        dataset = TensorDataset(torch.arange(NUM_SAMPLES), torch.arange(NUM_SAMPLES) % 10)
        ours = loader.DataLoader(dataset, **common)
    else:
        records = [os.urandom(RECORD_BYTES) for _ in range(NUM_SAMPLES)]
        dataset = loader.SourceDataset(MemorySource(records), transform=len)
        ours = loader.DataLoader(dataset, cache_bytes=8 << 20, cache_dir=cache_dir, **common)
    return {"torch": torch.utils.data.DataLoader(dataset, **common), "ours": ours}


@pytest.fixture(scope="module", params=["no-stall", "no-stall-warm-cache"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    cache_dir = scratch_cache_dir()
    try:
        loaders = _loaders(request.param, cache_dir)
        made = Pair(request.param, loaders)
        stats = loaders["ours"].stats()
        if request.param == "no-stall-warm-cache" and stats.records_cached != NUM_SAMPLES:
            pytest.fail(f"the cache holds {stats.records_cached} of {NUM_SAMPLES} records after the warm-up")
        yield made
        del made, loaders  # shuts the persistent workers down
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


@pytest.mark.parametrize("kind", KINDS)
def test_no_stall(benchmark, pair: Pair, kind: str) -> None:
    other = KINDS[1 - KINDS.index(kind)]
    benchmark.group = pair.name
    done = len(pair.rates[kind])
    benchmark.pedantic(pair.epoch, args=(kind,), setup=functools.partial(pair.epoch, other), rounds=ROUNDS)
    while len(pair.rates[kind]) - done < ROUNDS:  # benchmarks disabled: pedantic ran one round
        pair.epoch(other)
        pair.epoch(kind)
    benchmark.extra_info["batches_per_second"] = pair.rates[kind]


def test_no_stall_ratio(pair: Pair) -> None:
    if any(len(r) < 2 * ROUNDS for r in pair.rates.values()):
        pytest.fail("test_no_stall did not run both loaders; see above", pytrace=False)
    rows = [[kind, len(r), statistics.median(r), min(r), max(r)] for kind, r in pair.rates.items()]
    wanted = MIN_RATIO[pair.name]
    target = f"target >= {wanted}" if wanted is not None else "reported, not asserted"
    print(f"\n{pair.name}: median batches/s, ours / torch = {pair.ratio():.3f} ({target})")
    print(plain_table(["loader", "epochs", "median", "min", "max"], rows))
    if wanted is not None:
        assert pair.ratio() >= wanted, f"{pair.name}: ours/torch batches per second {pair.ratio():.3f}"
