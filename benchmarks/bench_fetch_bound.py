"""The headline figures: torch's DataLoader vs ours with ``cache_bytes="auto"``, the same memory for both.

Each loader runs as a job in its own cgroup, storage reads throttled to 200 MB/s by the kernel, the page cache
evicted first; epochs read a fresh random order and the transform only takes the record's length, so the
epoch time is the fetch time. The memory limit is the job's own memory (measured) plus what the case gives
to data; our cache lives in a fresh folder in /dev/shm whose pages the cgroup is charged for. Storage bytes
are the kernel's count (device bytes: whole pages).

Cases (``D`` = the dataset's bytes):

* ``whole``: memory for all of D. Both loaders read ~0 after epoch 1; ours no slower (>= 0.97, epochs 2-10).
* ``half``: memory for D/2 (the fetch-bound case). torch/ours >= 1.4; ours reads at most its floor, the
  device bytes of the records its cache does not hold (+2%).
* ``unlimited``: no memory limit, ours with an explicit ``cache_bytes`` of D/2 (what a user writes). The
  page cache keeps what our cache does not: both read ~0 after epoch 1; ours no slower (>= 0.97, epochs 2-10).
* ``small_files``: 40,000 records of 6,000 B (two pages each: 1.37x in device bytes), memory for a quarter
  of D. Ours reads at most its floor in device bytes (+2%); the memory our cache leaves free (its reserve)
  holds part of the rest in the page cache, so it reads less. So the same memory is also given to a fresh
  job of ours on the store the first one filled, the page cache evicted: reading each record once, it reads
  exactly its floor in device bytes (within 2% either way: a record it admits now in 512-byte blocks, read
  around the page cache, any other in whole pages), torch all of D.

    python -m pytest benchmarks/bench_fetch_bound.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from loader.cache import index_bytes
from stallbench.analysis.memory import measure_overhead, memory_limit, probe_cache_bytes
from stallbench.analysis.training import train_epochs
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import probe_storage_conditions
from stallbench.conditions.storage import data_size, evict_page_cache
from stallbench.jobs.command import run_command
from stallbench.jobs.kinds import DEFAULT, KINDS
from stallbench.jobs.run import scratch_cache_dir
from stallbench.jobs.spec import JobSpec, WorkloadJob
from stallbench.report import plain_table
from stallbench.workloads import make_jpeg_folder

READ_BPS = 200_000_000
JOB = dict(workers=2, batch_size=64)
SCRIPT = Path(__file__).with_name("_epoch_job.py")
GB = 1e9
DATASETS = {  # name: (records, record bytes, image size)
    "large": (18_000, 112 << 10, (500, 375)),
    "small": (40_000, 6_000, (64, 48)),
}
CASES = {  # name: (dataset, memory for data as a fraction of D (None: no limit), ours' cache_bytes, epochs,
    # rounds: pairs of jobs, torch's then ours, whose ratios' median is judged)
    "whole": ("large", 1.0, "auto", 10, 3),
    "half": ("large", 0.5, "auto", 4, 1),
    "unlimited": ("large", None, 0.5, 10, 5),
    "small_files": ("small", 0.25, "auto", 4, 1),
}
JOBS = [(case, pair, kind) for case, c in CASES.items() for pair in range(c[4]) for kind in DEFAULT]
NO_SLOWER = 0.97  # torch / ours, time of epochs 2-10 together, median of the case's pairs of jobs, where
# memory holds the dataset (half-second epochs: one pair alone swung from 0.88 to 1.05 on this machine, and
# 4 pairs of the unlimited case gave 0.986-1.023 one hour and 0.952-0.976 another: 5 pairs for it)
MIN_SPEEDUP = 1.4  # torch epoch time / ours, each of epochs 2-4, with memory for half
NEAR_ZERO = 0.02  # storage bytes per epoch after epoch 1, as a fraction of D, where memory holds it all
FLOOR_TOLERANCE = 0.02  # ours' storage bytes per epoch above its floor


@dataclass
class Data:
    path: Path
    records: int
    device_bytes: int  # whole pages of every record: what reading them all costs the storage device
    record_bytes: int
    overheads: dict[str, int] = field(default_factory=dict)


@pytest.fixture(scope="module")
def datasets(bench_data_root: Path) -> dict[str, Data]:
    return {}


def _data(name: str, root: Path, made: dict[str, Data]) -> Data:
    if name in made:
        return made[name]
    records, size, (width, height) = DATASETS[name]
    path = make_jpeg_folder(
        root / f"jpeg-{records}x{size}", num_images=records, record_bytes=size, width=width, height=height
    )
    problems = {k: v for k, v in probe_storage_conditions(path).items() if v is not None}
    if problems:
        pytest.fail(f"the fetch-bound conditions cannot be set up here: {problems}", pytrace=False)
    sizes = data_size(path.glob("*/*.jpg"))  # the records: not the hidden manifest beside them
    d = Data(path, records, sizes.device_bytes, sizes.record_bytes)
    probe = dict(epochs=1, persistent_workers=False, cache_bytes=probe_cache_bytes(records))
    d.overheads = measure_overhead(
        lambda kind, c, limits: run_workload(_job(d, kind, c, probe), limits, steps=2), DEFAULT, path
    )
    made[name] = d
    return d


def run_workload(job: WorkloadJob, limits: StorageLimits, steps: int | None = None) -> list[dict]:
    """The job's epochs as the bootstrap measured them, our loader's stats beside each epoch's figures."""
    spec = JobSpec(out_dir="", steps=steps, epochs=job.epochs, data=(str(job.data),))
    run = run_command([sys.executable, str(SCRIPT)], spec, limits=limits, job=job, log=sys.stderr)
    epochs = [{**e.stats, **dataclasses.asdict(e)} for e in train_epochs(run.records)[0]]
    reads = [e["hits"] + e["misses"] for e in epochs]
    return [{**e, "hit_rate": e["hits"] / n if n else 0.0} for e, n in zip(epochs, reads, strict=True)]


def _job(d: Data, kind: str, cache_dir: Path, options: dict, epochs: int = 1) -> WorkloadJob:
    """The job; ``cache_bytes`` (in ``options``) and the cache folder go to ours alone."""
    ours = dict(cache_dir=str(cache_dir)) if KINDS[kind].cached else {"cache_bytes": None}
    return WorkloadJob(kind, d.path, **{**JOB, "epochs": epochs, **options, **ours})


def _run(d: Data, kind: str, limit: int | None, cache_bytes: int | str, epochs: int) -> dict:
    cache_dir = scratch_cache_dir()
    try:
        evict_page_cache(d.path)
        with StorageLimits(memory_limit=limit, storage_bandwidth=READ_BPS, device_path=d.path) as limits:
            job = _job(d, kind, cache_dir, dict(cache_bytes=cache_bytes), epochs)
            records = run_workload(job, limits)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return {"epochs": records, "memory_peak": limits.memory_max_usage(), "failcnt": limits.memory_failcnt()}


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, int, str], dict]:
    return {}


@pytest.mark.benchmark(group="fetch-bound")
@pytest.mark.parametrize(("case", "pair", "kind"), JOBS)
def test_fetch_bound(benchmark, bench_data_root, datasets, runs, case: str, pair: int, kind: str) -> None:
    name, share, cache, epochs, _ = CASES[case]
    d = _data(name, bench_data_root, datasets)
    limit = None if share is None else memory_limit(round(share * d.device_bytes), d.overheads)
    cache_bytes = cache if cache == "auto" else round(cache * d.record_bytes) + index_bytes(d.records)
    run = benchmark.pedantic(_run, args=(d, kind, limit, cache_bytes, epochs), rounds=1, iterations=1)
    runs[case, pair, kind] = {**run, "limit": limit, "data": d}
    info = benchmark.extra_info
    info.update(case=case, memory_limit=limit, read_bps=READ_BPS, device_bytes=d.device_bytes)
    info.update({k: v for k, v in run.items() if k != "epochs"}, overheads=d.overheads)
    for key in ("seconds", "storage_bytes", "hit_rate", "cache_capacity", "records_cached", "memory_pauses"):
        info[f"epoch_{key}"] = [e.get(key) for e in run["epochs"]]


def _floor(d: Data, epoch: dict) -> int:
    """Device bytes of the records our cache does not hold: what a minimal-miss cache must read."""
    return (d.records - epoch["records_cached"]) * (d.device_bytes // d.records)


def _table(case: str, pair: int, runs: dict) -> str:
    d = runs[case, pair, "cached"]["data"]
    headers = ["epoch", "torch s", "torch GB", "ours s", "ours GB", "ours/floor", "hit rate", "time x"]
    rows = []
    for t, o in zip(runs[case, pair, "torch"]["epochs"], runs[case, pair, "cached"]["epochs"], strict=True):
        floor = _floor(d, o)
        ratio = f"{o['storage_bytes'] / floor:.4f}" if floor else "-"
        rows.append([t["epoch"], t["seconds"], t["storage_bytes"] / GB, o["seconds"]])
        rows[-1] += [o["storage_bytes"] / GB, ratio, o["hit_rate"], t["seconds"] / o["seconds"]]
    return plain_table(headers, rows)


def _report(case: str, pair: int, runs: dict) -> None:
    ours, torch_run = runs[case, pair, "cached"], runs[case, pair, "torch"]
    d, limit, last = ours["data"], ours["limit"], ours["epochs"][-1]
    limit_text = "none" if limit is None else f"{limit / GB:.3f} GB"
    print(f"\n{case}, pair {pair + 1}: D = {d.device_bytes / GB:.3f} GB device bytes, ", end="")
    print(f"{d.record_bytes / GB:.3f} GB of records")
    print(f"memory limit {limit_text} for both; job overheads {d.overheads} B")
    held = f"{last['records_cached']:,} records held, {last['memory_pauses']} memory pauses"
    print(f"ours: capacity {last['cache_capacity'] / GB:.3f} GB, {held}")
    peaks = (torch_run["memory_peak"] / GB, ours["memory_peak"] / GB)
    print(f"peak memory: torch {peaks[0]:.3f} GB, ours {peaks[1]:.3f} GB")
    print(_table(case, pair, runs))


def _steady(case: str, pair: int, runs: dict) -> list[tuple[dict, dict]]:
    torch_run, ours = runs[case, pair, "torch"], runs[case, pair, "cached"]
    return list(zip(torch_run["epochs"], ours["epochs"], strict=True))[1:]


@pytest.mark.parametrize("case", list(CASES))
def test_fetch_bound_targets(runs: dict, case: str) -> None:
    pairs = range(CASES[case][4])
    if any((case, p, k) not in runs for p in pairs for k in ("torch", "cached")):
        pytest.fail(f"the {case} runs did not all finish; see the failures above", pytrace=False)
    ratios = []
    for pair in pairs:
        _report(case, pair, runs)
        steady = _steady(case, pair, runs)
        ratios.append(sum(t["seconds"] for t, _ in steady) / sum(o["seconds"] for _, o in steady))
        _check_pair(case, runs[case, pair, "cached"]["data"], steady)
    if case in ("whole", "unlimited"):
        ratio = statistics.median(ratios)
        print(f"torch/ours, epochs 2-{CASES[case][3]} together, per pair: {ratios}; median {ratio:.3f}")
        assert ratio >= NO_SLOWER, f"torch/ours time of the warm epochs, median of pairs {ratio:.3f}"


def _check_pair(case: str, d: Data, steady: list[tuple[dict, dict]]) -> None:
    for t, o in steady:
        if case in ("whole", "unlimited"):
            for who in (t, o):
                assert who["storage_bytes"] <= NEAR_ZERO * d.device_bytes, f"{who['loader']} read {who}"
        else:
            floor = _floor(d, o)
            assert floor > 0, "the cache held every record: this case measures nothing"
            assert o["storage_bytes"] <= floor * (1 + FLOOR_TOLERANCE), f"epoch {o['epoch']}: floor {floor}"
        if case == "half":
            speedup = t["seconds"] / o["seconds"]
            assert speedup >= MIN_SPEEDUP, f"epoch {t['epoch']}: torch/ours epoch time {speedup:.2f}"


def test_a_fresh_job_reads_exactly_its_floor_in_device_bytes(bench_data_root, datasets) -> None:
    """``small_files``' memory and "auto", two jobs of ours on one cache folder, each after the page cache is
    evicted: the second starts with the store the first filled, so what its one epoch reads from storage is
    the records the store lacked (its misses): those it admits now in 512-byte blocks (``loader.system.
    direct``), the others in whole pages; torch's fresh job reads every record's pages."""
    name, share, cache, _, _ = CASES["small_files"]
    d = _data(name, bench_data_root, datasets)
    limit = memory_limit(round(share * d.device_bytes), d.overheads)
    cache_dir = scratch_cache_dir()
    try:
        jobs = [_fresh_job(d, kind, limit, cache, cache_dir) for kind in ("cached", "cached", "torch")]
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    ours, torch_job = jobs[1], jobs[2]
    page, blocks = d.device_bytes // d.records, -(-d.record_bytes // d.records // 512) * 512
    missing = d.records - ours["hits"]  # the records the store lacked at the job's start
    admitted = ours["records_admitted"]
    floor = admitted * blocks + (missing - admitted) * page
    ours_x, torch_x = ours["storage_bytes"] / floor, torch_job["storage_bytes"] / d.device_bytes
    print(
        f"\nfresh job on a filled store: floor {floor:,} device bytes ({missing:,} records missing: "
        f"{admitted:,} admitted, of {blocks:,} B read directly, the others of {page:,} B)"
    )
    print(f"ours read {ours['storage_bytes']:,} B = {ours_x:.4f} x its floor; torch {torch_x:.4f} x D")
    assert ours["hits"] > 0 and floor > 0 and ours["misses"] == missing
    assert abs(ours["storage_bytes"] - floor) <= FLOOR_TOLERANCE * floor
    assert abs(torch_job["storage_bytes"] - d.device_bytes) <= FLOOR_TOLERANCE * d.device_bytes


def _fresh_job(d: Data, kind: str, limit: int, cache: str, cache_dir: Path) -> dict:
    evict_page_cache(d.path)
    with StorageLimits(memory_limit=limit, storage_bandwidth=READ_BPS, device_path=d.path) as limits:
        return run_workload(_job(d, kind, cache_dir, dict(cache_bytes=cache)), limits)[0]
