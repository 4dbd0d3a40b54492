"""``stallbench analyze|compare --data s3://bucket/prefix``: data in object storage measured, against a real
S3-compatible server (moto's, on loopback): the bytes fetched over the network counted per epoch, the prep
run from a copy in memory, the limits that cannot hold named."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import documented_command, upload_jpegs

from loader.cache import index_bytes
from stallbench.analysis import phases
from stallbench.analysis.results import Workload
from stallbench.jobs.object_copies import local_path
from stallbench.report import validate_report_json
from stallbench.workloads import make_jpeg_folder

REPO = Path(__file__).resolve().parents[1]
URL = "s3://data/train"
pytestmark = pytest.mark.multiproc


@pytest.fixture
def bucket(s3_server, tmp_path) -> int:
    """``s3://data/train`` holding 48 small JPEGs in class folders; the objects' bytes."""
    local = make_jpeg_folder(tmp_path / "imgs", num_images=48, record_bytes=6000, width=64, height=48)
    return upload_jpegs(local)


def stallbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "stallbench", *args, "--no-progress"]
    return subprocess.run(argv, cwd=cwd, env=env, text=True, capture_output=True, timeout=600)


def _runs(loader: dict) -> dict[str, list[dict]]:
    return {run["phase"]: run["epochs"] for run in loader["runs"]}


@pytest.mark.slow
def test_compare_counts_what_each_loader_fetched_over_the_network(bucket, tmp_path):
    done = stallbench(
        *documented_command(REPO / "docs" / "stallbench.md", f"stallbench compare --data {URL}"), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    validate_report_json(report)
    assert report["workload"]["dataset_bytes"] == bucket  # the objects' bytes, from the listing
    torch, ours = (_runs(loader) for loader in report["loaders"])
    assert [e["storage_bytes"] for e in torch["cold"]] == [bucket] * 3  # no page cache for the network
    fetched = [e["storage_bytes"] for e in ours["cold"]]  # a cache of half: the same misses every epoch
    held = report["workload"]["cache_bytes"] - index_bytes(48)  # the store's room for records
    assert fetched[0] == bucket and fetched[1] == fetched[2] and 0 < fetched[1] <= bucket - held + 2 * 6000
    for runs in (torch, ours):
        assert [e["samples"] for e in runs["prep"]] == [48] * 3
    assert all(loader["machine"]["storage_bytes_per_s"] > 0 for loader in report["loaders"])


def test_a_disk_throttle_on_data_in_object_storage_is_named(bucket, tmp_path):
    done = stallbench("analyze", "--data", URL, "--storage-bandwidth", "10MB", cwd=tmp_path)
    assert done.returncode == 2
    assert "--storage-bandwidth throttles a disk, and s3://data/train comes over the network" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_bucket_is_named(bucket, tmp_path):
    done = stallbench("analyze", "--data", "s3://nothing/here", cwd=tmp_path)
    assert done.returncode == 2
    assert "'s3://nothing/here' cannot be listed" in done.stderr and "Traceback" not in done.stderr


def test_a_command_s_data_must_be_local(tmp_path):
    done = stallbench("analyze", "--data", URL, "--", sys.executable, "-c", "pass", cwd=tmp_path)
    assert done.returncode == 2
    assert f"--data {URL}: with a command, --data names the local files it reads" in done.stderr


@pytest.mark.parametrize(
    "key", ["cat//x.jpg", "cat/../../x.jpg", "./cat/x.jpg", "cat/.hidden.jpg", "/cat/x.jpg"]
)
def test_a_key_no_local_folder_can_hold_is_named_not_written_outside(tmp_path, key):
    with pytest.raises(ValueError, match=re.escape(repr(key))):
        local_path(tmp_path / "copy", key)
    assert local_path(tmp_path / "copy", "cat/x.jpg") == tmp_path / "copy" / "cat" / "x.jpg"


def test_every_run_but_the_cold_one_reads_the_copy_in_memory(monkeypatch, tmp_path):
    read = []

    def record(argv, spec, *, limits, log, job):
        read.append((job.data, spec.data))

    monkeypatch.setattr(phases, "run_command", record)
    workload = Workload(
        data=URL, dataset_bytes=1000, record_bytes=1000, samples=10, batch_size=2, workers=1,
        compute="emulated:0", epochs=1, cache_bytes=500, storage_bandwidth=None, memory_limit=None,
    )  # fmt: skip
    copy = str(tmp_path / "copy")
    target = phases.WorkloadRuns(phases.RunPlan(workload, in_memory_data=copy), "torch")
    assert target.data() == []  # nothing local to warm or evict
    for phase in ("prep", "ingestion", "cold"):
        target.run(phase, cache_bytes=None, limits=None)
    assert read == [(copy, (copy,)), (copy, (copy,)), (URL, (URL,))]


def test_copies_in_memory_that_would_take_more_than_their_share_are_refused_before_any_run(monkeypatch):
    from loader.system.memory import MemoryView
    from stallbench.analysis import object_data

    monkeypatch.setattr("loader.system.memory_view", lambda: MemoryView(1000 << 20, 2000 << 20, "the cgroup"))
    object_data.check_room_for_copies(URL, 160 << 20, 2)  # 480 MiB of 1,000: within the half
    with pytest.raises(ValueError, match=r"--data s3://data/train: .*2 converted copies.*\(the cgroup: "):
        object_data.check_room_for_copies(URL, 200 << 20, 2)  # 600 MiB: more than half
