"""Never slower without a step: ``cache_files=`` against torch's loader on a loop that only loads.

The digits job's training loader (``_digits_job.py loop``: 11,520 JPEGs of ~3.8 KB, a Dataset that opens each
with ``PIL.Image.open``, batch 64, shuffled) iterated 4 epochs with no step, each loader in its own process,
pairs alternating, without workers and with 2, the data already in the page cache (warm: the job's files
read before). What is left of each epoch is the loader's own per-file work, which no step hides: the case
where a served read's Python cost showed most (epoch 1 25-30%, later epochs 10-12% slower without workers,
before ``loader/serving/stepping_aside.py``). Target, warm, per epoch: the median over pairs of torch/ours
>= ``MIN_RATIO`` (within the noise of this machine's pairs). Cold rows (page cache evicted before each job,
storage unthrottled) are printed beside them, without a target: the store steps aside there only where the
page cache has room for the files, which a machine with less memory than this one may not have.

    python -m pytest benchmarks/bench_cache_files_overhead.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import shutil
import statistics
import sys
from pathlib import Path

import pytest

from stallbench.conditions.storage import evict_page_cache, warm_page_cache
from stallbench.jobs.run import run_job, scratch_cache_dir
from stallbench.report import plain_table

SCRIPT = Path(__file__).with_name("_digits_job.py")
EPOCHS, PAIRS, MIN_RATIO = 4, 3, 0.95


def epochs(kind: str, data: Path, workers: int, warm: bool) -> list[float]:
    """One job's epoch seconds, its cache (ours) in a folder of its own, removed after."""
    cache_dir = scratch_cache_dir()
    try:
        (warm_page_cache if warm else evict_page_cache)(data)
        argv = [sys.executable, str(SCRIPT), "loop", kind, str(data), str(cache_dir)]
        return run_job([*argv, str(workers), str(EPOCHS)], timeout=600)[0]["seconds"]
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="cache-files-overhead")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_without_a_step_is_not_slower_than_torchs(benchmark, digits_data: Path, workers: int) -> None:
    runs: dict[tuple[str, bool], list[list[float]]] = {}

    def pair() -> None:
        kinds = ("torch", "ours") if len(runs.get(("torch", True), [])) % 2 == 0 else ("ours", "torch")
        for warm in (True, False):
            for kind in kinds:
                runs.setdefault((kind, warm), []).append(epochs(kind, digits_data, workers, warm))

    benchmark.pedantic(pair, rounds=PAIRS)
    while len(runs[("torch", True)]) < PAIRS:  # benchmarks disabled
        pair()
    rows, medians = [], {}
    for warm in (True, False):
        ratios = [
            [t / o for t, o in zip(torch_job, ours_job, strict=True)]
            for torch_job, ours_job in zip(runs[("torch", warm)], runs[("ours", warm)], strict=True)
        ]
        medians[warm] = [statistics.median(pair[e] for pair in ratios) for e in range(EPOCHS)]
        for kind in ("torch", "ours"):
            seconds = [" ".join(f"{s:.2f}" for s in job) for job in runs[(kind, warm)]]
            rows.append(["warm" if warm else "cold", kind, seconds])
        rows.append(["warm" if warm else "cold", "torch/ours (median)", [f"{r:.2f}" for r in medians[warm]]])
    print(f"\n{workers} workers, no step, {EPOCHS} epochs, {PAIRS} pairs alternating")
    print(plain_table(["page cache", "loader", "epoch seconds per job"], rows))
    benchmark.extra_info.update(workers=workers, warm=medians[True], cold=medians[False])
    assert min(medians[True]) >= MIN_RATIO, f"warm, {workers} workers: torch/ours {medians[True]}"
