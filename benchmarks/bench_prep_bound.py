"""Prep-bound, warm data: records held prepared make decode-bound epochs faster than torch's loader.

1,200 JPEGs of 500x375, ``loader.ImageFolder``, batch 64, 2 persistent workers. Each job (``_prep_job.py``)
is one loader in its own process: torch's DataLoader reads the files from the page cache; ours reads every
record from its warm cache, held raw (``raw``: as before prepared records), or in the form ``cache_form=
"auto"`` picks with room for all (``prepared``) or half (``partial``: every record raw and the rest of the
room prepared, a mix) of the records prepared. After an
untimed warm-up epoch each job times EPOCHS epochs. In each round every kind runs once, the order turned by
one each round; the medians of the images per second are compared:

- ``transform="train"``: prepared / torch >= 2.0; raw / torch >= 0.99; partial / raw >= 1.15;
- ``transform="eval"``: prepared / torch >= 5.0.

    python -m pytest benchmarks/bench_prep_bound.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

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
KINDS = ("torch", "raw", "prepared", "partial")
TARGETS = {  # transform: (kind, over, at least)
    "train": (("prepared", "torch", 2.0), ("raw", "torch", 0.99), ("partial", "raw", 1.15)),
    "eval": (("prepared", "torch", 5.0),),
}


class Runs:
    """Every timed epoch of each loader's jobs for one transform, run one job at a time."""

    def __init__(self, data: Path, cache_dir: Path, transform: str) -> None:
        self.data, self.cache_dir, self.transform = data, cache_dir, transform
        self.kinds = tuple(dict.fromkeys(k for target in TARGETS[transform] for k in target[:2]))
        self.epochs: dict[str, list[dict]] = {kind: [] for kind in self.kinds}
        self.rounds = 0

    def round(self) -> None:
        turn = self.rounds % len(self.kinds)
        for kind in self.kinds[turn:] + self.kinds[:turn]:
            self.job(kind)
        self.rounds += 1

    def job(self, kind: str) -> None:
        argv = [sys.executable, str(SCRIPT), kind, str(self.data), str(EPOCHS), str(self.cache_dir)]
        argv += ["load", self.transform]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
        if done.returncode != 0:
            pytest.fail(f"the {kind} job exited {done.returncode}:\n{done.stderr[-2000:]}", pytrace=False)
        self.epochs[kind] += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def median(self, kind: str, field: str = "images_per_s") -> float:
        return statistics.median(e[field] for e in self.epochs[kind])


@pytest.fixture(scope="module")
def data(bench_data_root: Path) -> Path:
    return make_jpeg_folder(bench_data_root / f"prep-{NUM_IMAGES}", num_images=NUM_IMAGES)


@pytest.mark.benchmark(group="prep-bound")
@pytest.mark.parametrize("transform", TARGETS)
def test_prep_bound(benchmark, data: Path, transform: str) -> None:
    cache_dir = scratch_cache_dir()
    try:
        runs = Runs(data, cache_dir, transform)
        benchmark.pedantic(runs.round, rounds=ROUNDS)
        while runs.rounds < ROUNDS:  # benchmarks disabled: pedantic ran one round
            runs.round()
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    rows = [
        [
            k,
            len(runs.epochs[k]),
            runs.epochs[k][0]["form"],
            runs.median(k),
            runs.median(k, "cpu_us_per_image"),
        ]
        for k in runs.kinds
    ]
    print(f"\nprep-bound, transform={transform!r}: median images/s over {ROUNDS} rounds of {EPOCHS} epochs")
    print(plain_table(["loader", "epochs", "cache holds", "images/s", "CPU us/image"], rows))
    ratios = {(kind, over): runs.median(kind) / runs.median(over) for kind, over, _ in TARGETS[transform]}
    benchmark.extra_info["ratios"] = {f"{k}/{o}": r for (k, o), r in ratios.items()}
    for (kind, over), ratio in ratios.items():
        print(f"{kind} / {over} = {ratio:.2f}")
    missed = [
        f"{k}/{o} {ratios[k, o]:.2f} < {least}" for k, o, least in TARGETS[transform] if ratios[k, o] < least
    ]
    assert not missed, f"prep-bound {transform}: " + "; ".join(missed)
