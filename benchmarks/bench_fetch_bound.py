"""The headline figure: a fetch-bound job, torch's DataLoader vs ours, the same memory and storage bandwidth.

2.06 GB of JPEG records (18,000 x 112 KiB, whole pages, so record bytes are device bytes), read in a fresh
random order each epoch with a transform that only takes the record's length. Each loader runs as a job in
its own cgroup: storage reads throttled to 200 MB/s and memory limited to C + overhead, where C = D / 2 is
our cache (kept in a fresh folder in /dev/shm whose pages the cgroup is charged for) and the overhead is the
job's own memory, measured. The page cache is evicted before each job. Storage bytes are the kernel's count.

    python -m pytest benchmarks/bench_fetch_bound.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stallbench._jobs import (
    job_argv,
    measure_overhead,
    memory_limit,
    probe_cache_bytes,
    run_job,
    scratch_cache_dir,
)
from stallbench.demo import format_table
from stallbench.storage import StorageLimits, evict_page_cache, probe_storage_conditions
from stallbench.workloads import make_jpeg_folder

NUM_RECORDS, RECORD_BYTES = 18_000, 112 << 10
READ_BPS = 200_000_000
JOB = dict(epochs=3, workers=2, batch_size=64)
SCRIPT = Path(__file__).with_name("_epoch_job.py")
MIN_SPEEDUP = 1.4  # torch epoch time / ours, epochs 2-3
FLOOR_TOLERANCE = 0.02  # ours' storage bytes per epoch vs the MinIO floor (1 - C/D) * D
GB = 1e9


@dataclass
class Setup:
    data: Path
    dataset_bytes: int
    cache_bytes: int
    memory_limit: int = 0
    overheads: dict[str, int] = field(default_factory=dict)


def _argv(setup: Setup, kind: str, cache_dir: Path, **override: int) -> list[str]:
    cache = dict(cache_bytes=setup.cache_bytes, cache_dir=cache_dir) if kind == "cached" else {}
    return job_argv(kind, setup.data, script=SCRIPT, **{**JOB, **cache, **override})


@pytest.fixture(scope="module")
def setup(bench_data_root: Path) -> Setup:
    root = bench_data_root / f"jpeg-{NUM_RECORDS}x{RECORD_BYTES}"
    data = make_jpeg_folder(root, num_images=NUM_RECORDS, record_bytes=RECORD_BYTES)
    problems = {k: v for k, v in probe_storage_conditions(data).items() if v is not None}
    if problems:
        pytest.fail(f"the fetch-bound conditions cannot be set up here: {problems}", pytrace=False)
    dataset_bytes = sum(p.stat().st_size for p in data.glob("*/*.jpg"))
    s = Setup(data, dataset_bytes, dataset_bytes // 2)
    probe = dict(epochs=1, max_batches=2, cache_bytes=probe_cache_bytes(NUM_RECORDS))
    s.overheads = measure_overhead(lambda kind, d: _argv(s, kind, d, **probe), ["torch", "cached"], data)
    s.memory_limit = memory_limit(s.cache_bytes, s.overheads)
    return s


def _run(setup: Setup, kind: str) -> dict:
    cache_dir = scratch_cache_dir()
    try:
        evict_page_cache(setup.data)
        limits = StorageLimits(memory_bytes=setup.memory_limit, read_bps=READ_BPS, device_path=setup.data)
        with limits:
            epochs = run_job(_argv(setup, kind, cache_dir), limits)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    cgroup = {"cgroup_read_bytes": limits.read_bytes(), "memory_peak": limits.memory_max_usage()}
    return {"epochs": epochs, **cgroup, "memory_failcnt": limits.memory_failcnt()}


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return {}


@pytest.mark.benchmark(group="fetch-bound")
@pytest.mark.parametrize("kind", ["torch", "cached"])
def test_fetch_bound(benchmark, setup: Setup, runs: dict[str, dict], kind: str) -> None:
    run = benchmark.pedantic(_run, args=(setup, kind), rounds=1, iterations=1)
    runs[kind] = run
    info = benchmark.extra_info
    info.update(vars(setup), data=str(setup.data), read_bps=READ_BPS)
    info.update({k: v for k, v in run.items() if k != "epochs"})
    for key in ("seconds", "storage_bytes", "hit_rate"):
        info[f"epoch_{key}"] = [e.get(key) for e in run["epochs"]]


def _epochs(runs: dict[str, dict]) -> list[tuple[dict, dict]]:
    return list(zip(runs["torch"]["epochs"], runs["cached"]["epochs"], strict=True))


def _table(setup: Setup, runs: dict[str, dict]) -> str:
    floor = setup.dataset_bytes - setup.cache_bytes
    headers = ["epoch", "torch s", "torch GB", "ours s", "ours GB", "ours/floor", "hit rate", "time x"]
    rows = []
    for t, o in _epochs(runs):
        gb = (t["storage_bytes"] / GB, o["storage_bytes"] / GB)
        ratio = f"{o['storage_bytes'] / floor:.4f}"
        rows.append([t["epoch"], t["seconds"], gb[0], o["seconds"], gb[1], ratio, o["hit_rate"]])
        rows[-1].append(t["seconds"] / o["seconds"])
    return format_table(headers, rows)


def test_fetch_bound_targets(setup: Setup, runs: dict[str, dict]) -> None:
    if set(runs) != {"torch", "cached"}:
        pytest.fail(f"only {sorted(runs)} ran; see the failures above", pytrace=False)
    print(f"\nfetch-bound: D = {setup.dataset_bytes / GB:.3f} GB, C = {setup.cache_bytes / GB:.3f} GB")
    print(f"memory limit {setup.memory_limit / GB:.3f} GB for both (job overheads {setup.overheads} B)")
    print(f"storage throttled to {READ_BPS / 1e6:.0f} MB/s; floor (1 - C/D) * D per epoch; GB = 1e9 B")
    print(_table(setup, runs))
    floor = setup.dataset_bytes - setup.cache_bytes
    for t, o in _epochs(runs)[1:]:
        off = abs(o["storage_bytes"] - floor) / floor
        assert off <= FLOOR_TOLERANCE, f"epoch {o['epoch']}: ours read {o['storage_bytes']} B; floor {floor}"
        speedup = t["seconds"] / o["seconds"]
        assert speedup >= MIN_SPEEDUP, f"epoch {t['epoch']}: torch/ours epoch time {speedup:.2f}"
