"""The differential method on tiny workloads: each stall shows when, and only when, it is made to."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallbench.analysis.analyze import analyze, prepare
from stallbench.analysis.phases import breakdown
from stallbench.analysis.request import AnalysisRequest, CacheSpec
from stallbench.analysis.results import EpochRecord, RunRecord
from stallbench.conditions.storage import probe_storage_conditions

SLOW_PREP_JOB = str(Path(__file__).with_name("_slow_prep_job.py"))


def run(tmp_path, *, transform="none", job_script=None, epochs=2, **options):
    req = AnalysisRequest(
        data="images:32", data_dir=tmp_path, batch_size=8, epochs=epochs, transform=transform, **options
    )
    plan = prepare(req, ["cached"])
    if job_script is not None:
        plan = type(plan)(**{**plan.__dict__, "job_script": job_script})
    (report,) = analyze(plan, ["cached"])
    return report


@pytest.mark.slow
@pytest.mark.multiproc
def test_slow_prep_shows_as_prep_stall(tmp_path):
    r = run(tmp_path, job_script=SLOW_PREP_JOB, workers=1, compute="emulated:1", cache=CacheSpec(1.0))
    b = r.breakdown
    assert b.prep_stall_seconds > 0.5 * b.epoch_seconds  # 32 x 10 ms of prep against 4 x 1 ms of compute
    assert b.fetch_stall_seconds < 0.2 * b.epoch_seconds


@pytest.mark.slow
@pytest.mark.multiproc
def test_throttled_storage_shows_as_fetch_stall(tmp_path):
    """One epoch, so that it is the cold one: every record comes from storage whatever the page cache keeps
    of the records the cache does not admit (with no memory limit, all of them)."""
    reason = probe_storage_conditions(tmp_path)["read_throttle"]
    if reason is not None:
        pytest.fail(f"this test needs a kernel read throttle: {reason}")
    r = run(
        tmp_path,
        workers=1,
        compute="emulated:1",
        cache=CacheSpec(0.5),
        storage_bytes_per_s=2_000_000,
        epochs=1,
    )
    b = r.breakdown
    assert b.fetch_stall_seconds > 0.5 * b.epoch_seconds  # 3.7 MB at 2 MB/s, against workers starting
    assert r.dataset_bytes <= r.storage_bytes < 1.05 * r.dataset_bytes  # all of it, in the kernel's bytes
    assert r.roofline.bound == "fetch"


@pytest.mark.slow
@pytest.mark.multiproc
def test_cached_data_and_cheap_prep_show_no_stall(tmp_path):
    # 4 batches an epoch: at 40 ms a step, one batch's worth of worker-start jitter (~20 ms) was already 10%
    r = run(tmp_path, workers=1, compute="emulated:80", cache=CacheSpec(1.0))
    b = r.breakdown
    assert b.prep_stall_seconds + b.fetch_stall_seconds < 0.25 * b.epoch_seconds
    assert "no stall worth acting on" in r.advice


@pytest.mark.slow
@pytest.mark.multiproc
def test_breakdown_adds_up(tmp_path):
    r = run(tmp_path, workers=1, compute="emulated:5", cache=CacheSpec(0.5))
    b = breakdown({run.phase: run for run in r.runs})
    assert b == r.breakdown
    parts = b.compute_seconds + b.prep_stall_seconds + b.fetch_stall_seconds
    assert parts >= b.epoch_seconds * 0.999  # the stalls are clamped at zero, never negative


def _run(phase: str, seconds: float, wait: float) -> RunRecord:
    epochs = tuple(EpochRecord(e, seconds, wait, seconds - wait, 0.1, 10, 640, 0) for e in (1, 2, 3))
    return RunRecord(phase, epochs, "condition")


def test_compute_is_the_ingestion_runs_steps_not_its_waits():
    """The ingestion run's waits are its copies arriving from the workers, not compute: T1 is its steps."""
    runs = {
        "ingestion": _run("ingestion", 5.0, 1.0),
        "prep": _run("prep", 7.0, 3.0),
        "cold": _run("cold", 9.0, 5.0),
    }
    b = breakdown(runs)
    assert (b.compute_seconds, b.prep_stall_seconds, b.fetch_stall_seconds, b.epoch_seconds) == (
        4.0,
        3.0,
        2.0,
        9.0,
    )
