"""Never the reason a job dies: a job whose memory jumps at each evaluation, under the kernel's own memory
limit (cgroup v1, as root), with torch's DataLoader and with ours, the cache in its default home.

M is the larger of the two loaders' jobs' own peaks without a limit (the cgroup's peak less the data it
left in the page cache), D the records' bytes; under L = M + D/2 torch's job finishes, and so must ours,
whatever it is told the cache may hold. The jobs are ``_evaluating_job.py``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import upload_jpegs

from loader.sources import image_folder_to_arrow, image_folder_to_lmdb, image_folder_to_tar_shards
from loader.system.home import CACHE_DIR_VARIABLE
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import probe_storage_conditions
from stallbench.conditions.storage import evict_page_cache, resident_bytes

HERE = Path(__file__).parent
JOB = HERE / "_evaluating_job.py"
MIB = 1 << 20
FILES, FILE_BYTES = 400, 128 << 10  # D = 50 MiB in two class folders
EPOCHS, EVAL_MIB = 2, 64

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("evaluating") / "data"
    problem = probe_storage_conditions(root.parent)["memory_limit"]
    if problem is not None:
        pytest.skip(f"needs a memory cgroup (cgroup v1, as root): {problem}")
    rng = np.random.default_rng(0)
    for i in range(FILES):
        folder = root / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:04d}.jpg").write_bytes(rng.bytes(FILE_BYTES))
    return root


def argv(kind: str, data: Path, cache_bytes: str = "none", source: str = "files") -> list[str]:
    return [sys.executable, str(JOB), kind, str(data), cache_bytes, str(EPOCHS), str(EVAL_MIB), source]


def env(home: Path) -> dict[str, str]:
    """The jobs' environment: this checkout importable, the caches in ``home`` (each test's own)."""
    paths = os.pathsep.join([str(HERE), str(HERE.parent)])
    return {**os.environ, "PYTHONPATH": paths, CACHE_DIR_VARIABLE: str(home)}


def run(limits: StorageLimits, args: list[str], home: Path) -> subprocess.CompletedProcess:
    return limits.run(args, capture_output=True, text=True, timeout=240, env=env(home))


def last_epoch(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def own_memory(data: Path) -> int:
    """M: the larger of torch's job's and ours' (no cache) own peaks, each without a limit."""
    peaks = []
    for kind in ("torch", "torch", "ours"):  # the first, not counted, puts the libraries in the page cache
        evict_page_cache(data)
        with StorageLimits() as limits:
            done = run(limits, argv(kind, data), data.parent)
        assert done.returncode == 0, done.stderr[-2000:]
        peaks.append(limits.memory_max_usage() - resident_bytes(data, whole_pages=True))
    return max(peaks[1:])


def data_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in data.rglob("*.jpg"))


STORED = {"lmdb": "lmdb", "tar": "shards", "arrow": "records.arrow"}  # source: where beside the files


def converted(data: Path, source: str) -> Path:
    """Where the job's records of ``source`` lie on this machine, written there from ``data``'s files the
    first time (``data`` itself for a source of the files, and for ``s3``: its server has its own copy)."""
    if source == "s3":
        upload_jpegs(data)
    if source not in STORED:
        return data
    stored = data.parent / STORED[source]
    if stored.exists():
        return stored
    if source == "lmdb":
        image_folder_to_lmdb(data, stored)
    elif source == "tar":
        image_folder_to_tar_shards(data, stored, shard_bytes=16 << 20)
    else:
        image_folder_to_arrow(data, stored, batch_rows=64)
    return stored


@pytest.fixture
def s3_data(request):
    """The S3 server the ``s3`` case reads from (``s3_server``, started for that case only)."""
    return request.getfixturevalue("s3_server") if request.node.callspec.params["source"] == "s3" else None


def test_under_the_larger_job_s_peak_and_half_the_data_no_job_of_either_loader_is_killed(
    data, own_memory, tmp_path
):
    limit = own_memory + data_bytes(data) // 2
    jobs = {
        "torch": argv("torch", data),
        "ours, auto": argv("ours", data, "auto"),
        "ours, cache_bytes=D": argv("ours", data, str(data_bytes(data))),
        "ours, ImageFolder": argv("ours", data, "auto", "folder"),
        "ours, ImageFolder, coordinate=True": argv("ours", data, "auto", "coordinated"),
    }
    outcomes: dict[str, list] = {name: [] for name in jobs}
    for round_ in range(5):
        for name, args in jobs.items():
            if "ImageFolder" in name and round_ % 3:  # ours' two other kinds of Dataset: 2 runs each
                continue
            evict_page_cache(data)
            with StorageLimits(memory_limit=limit) as limits:
                done = run(limits, args, tmp_path)
                outcomes[name].append((done.returncode, limits.oom_kills(), done.stderr[-1500:]))
    killed = {name: [o for o in runs if o[:2] != (0, 0)] for name, runs in outcomes.items()}
    assert not any(killed.values()), f"under {limit / MIB:.0f} MiB: {killed}"
    assert [len(runs) for runs in outcomes.values()] == [5, 5, 5, 2, 2]


@pytest.mark.parametrize("source", ["lmdb", "arrow", "tar", "s3", "prepared", "partition", "no-workers"])
def test_every_other_kind_of_dataset_told_to_cache_all_of_it_is_not_killed(
    data, own_memory, source, s3_data, tmp_path
):
    """Each once, ``cache_bytes`` forced to D, under L = M + D/2, M the larger of ``own_memory`` and this
    kind's own job's peak without a cache (less the records it left in the page cache)."""
    stored = converted(data, source)
    evict_page_cache(stored)
    with StorageLimits() as limits:
        done = run(limits, argv("ours", data, "none", source), tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    peak = limits.memory_max_usage() - resident_bytes(stored, whole_pages=True)
    limit = max(own_memory, peak) + data_bytes(data) // 2
    evict_page_cache(stored)
    with StorageLimits(memory_limit=limit) as limits:
        done = run(limits, argv("ours", data, str(data_bytes(data)), source), tmp_path)
        kills = limits.oom_kills()
    assert (done.returncode, kills) == (0, 0), done.stderr[-2000:]
    stats = last_epoch(done)
    assert stats["samples"] == EPOCHS * FILES and stats["records_cached"] > 0


def test_a_size_larger_than_the_job_can_spare_is_lowered_with_one_warning_naming_both(
    data, own_memory, tmp_path
):
    limit, asked = own_memory + data_bytes(data) // 2, 4 * data_bytes(data)
    evict_page_cache(data)
    with StorageLimits(memory_limit=limit) as limits:
        done = run(limits, argv("ours", data, str(asked)), tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    warned = [line for line in done.stderr.splitlines() if "lowered to" in line]
    assert len(warned) == 1 and f"cache_bytes={asked} (200.0 MiB) lowered to" in warned[0]
    assert "free per the cgroup v1 memory limit" in warned[0]
    stats = last_epoch(done)
    assert stats["cache_sizing"].startswith(f"cache_bytes={asked} (200.0 MiB) lowered to")
    assert stats["cache_capacity"] < limit and stats["records_admitted"] == stats["records_cached"] > 0


def test_a_second_job_starts_beside_a_full_store_in_a_cgroup_of_its_own(data, own_memory, tmp_path):
    limit = own_memory + data_bytes(data) // 2
    evict_page_cache(data)
    with StorageLimits(memory_limit=limit) as first, StorageLimits(memory_limit=limit) as second:
        job = argv("ours", data, "auto")
        filling = first.popen(job, stdout=subprocess.PIPE, text=True, env=env(tmp_path))
        try:
            filled = json.loads(filling.stdout.readline())  # its epoch 1: the store holds what it will hold
            beside = run(second, job, tmp_path)
            rest = filling.communicate(timeout=240)[0]
        finally:
            filling.kill()
            filling.wait()
        kills = first.oom_kills(), second.oom_kills()
    assert filled["records_cached"] > 0
    assert (filling.returncode, beside.returncode, kills) == (0, 0, (0, 0)), beside.stderr[-2000:]
    assert last_epoch(beside)["hits"] > 0 and json.loads(rest.splitlines()[-1])["epoch"] == EPOCHS


def test_the_limit_lowered_below_what_the_job_holds_while_it_runs_is_met_and_the_job_finishes(
    data, own_memory, tmp_path
):
    roomy, tight = own_memory + 3 * data_bytes(data), own_memory + data_bytes(data) // 4
    evict_page_cache(data)
    with StorageLimits(memory_limit=roomy) as limits:
        job = limits.popen(argv("ours", data, "auto"), stdout=subprocess.PIPE, text=True, env=env(tmp_path))
        try:
            epoch1 = json.loads(job.stdout.readline())
            limits.set_memory_limit(tight)  # the store's pages alone would not fit: the kernel takes them
            rest = job.communicate(timeout=240)[0]
        finally:
            job.kill()
            job.wait()
        kills = limits.oom_kills()
    assert epoch1["cache_bytes_used"] > tight - own_memory  # it held more than the new limit leaves
    assert (job.returncode, kills) == (0, 0)
    assert json.loads(rest.splitlines()[-1])["samples"] == EPOCHS * FILES
