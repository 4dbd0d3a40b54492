"""Prep-bound, warm data: loader.DataLoader keeps pace with torch's loader when decode decides the pace.

1,200 JPEGs of 500x375, ``loader.ImageFolder(transform="train")``, batch 64, 2 persistent workers. Each job
(``_prep_job.py``) is one loader in its own process over that same dataset object: torch's DataLoader reads
the files from the page cache, ours reads every record from its warm cache. After an untimed warm-up epoch
each job times EPOCHS epochs. Jobs alternate (torch, ours, ours, torch, ...) in one run; the medians of the
images per second are compared: ours / torch >= 0.99.

    python -m pytest benchmarks/bench_prep_bound.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import functools
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from stallbench.jobs.run import scratch_cache_dir
from stallbench.report import plain_table
from stallbench.workloads import make_jpeg_folder

SCRIPT = Path(__file__).with_name("_prep_job.py")
REPO = Path(__file__).resolve().parents[1]
NUM_IMAGES, EPOCHS, ROUNDS = 1200, 3, 3
MIN_RATIO = 0.99
KINDS = ("torch", "ours")


class Runs:
    """Every timed epoch of each loader's jobs, run one job at a time."""

    def __init__(self, data: Path, cache_dir: Path) -> None:
        self.data, self.cache_dir = data, cache_dir
        self.epochs: dict[str, list[dict]] = {kind: [] for kind in KINDS}

    def job(self, kind: str) -> None:
        argv = [sys.executable, str(SCRIPT), kind, str(self.data), str(EPOCHS), str(self.cache_dir)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
        if done.returncode != 0:
            pytest.fail(f"the {kind} job exited {done.returncode}:\n{done.stderr[-2000:]}", pytrace=False)
        self.epochs[kind] += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def median(self, kind: str, field: str = "images_per_s") -> float:
        return statistics.median(e[field] for e in self.epochs[kind])


@pytest.fixture(scope="module")
def runs(bench_data_root: Path):
    data = make_jpeg_folder(bench_data_root / f"prep-{NUM_IMAGES}", num_images=NUM_IMAGES)
    cache_dir = scratch_cache_dir()
    try:
        yield Runs(data, cache_dir)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


@pytest.mark.benchmark(group="prep-bound")
@pytest.mark.parametrize("kind", KINDS)
def test_prep_bound(benchmark, runs: Runs, kind: str) -> None:
    other = KINDS[1 - KINDS.index(kind)]
    done = len(runs.epochs[kind])
    benchmark.pedantic(runs.job, args=(kind,), setup=functools.partial(runs.job, other), rounds=ROUNDS)
    while len(runs.epochs[kind]) - done < ROUNDS * EPOCHS:  # benchmarks disabled: pedantic ran one round
        runs.job(other)
        runs.job(kind)
    benchmark.extra_info["images_per_s"] = [e["images_per_s"] for e in runs.epochs[kind]]


def test_prep_bound_ratio(runs: Runs) -> None:
    if any(len(e) < 2 * ROUNDS * EPOCHS for e in runs.epochs.values()):
        pytest.fail("test_prep_bound did not run both loaders; see above", pytrace=False)
    rows = [[k, len(runs.epochs[k]), runs.median(k), runs.median(k, "cpu_us_per_image")] for k in KINDS]
    ratio = runs.median("ours") / runs.median("torch")
    print(f"\nprep-bound: median images/s, ours / torch = {ratio:.3f} (target >= {MIN_RATIO})")
    print(plain_table(["loader", "epochs", "images/s", "CPU us/image"], rows))
    assert ratio >= MIN_RATIO, f"prep-bound: ours/torch images per second {ratio:.3f}"
