"""The differential method on tiny workloads: each stall shows when, and only when, it is made to."""

from __future__ import annotations

import math
from dataclasses import astuple, replace
from pathlib import Path

import pytest

from stallbench.analysis.analyze import analyze, prepare
from stallbench.analysis.breakdown import breakdown
from stallbench.analysis.request import AnalysisRequest, CacheSpec
from stallbench.analysis.results import EpochRecord, RunRecord
from stallbench.conditions.limits import Limits, probe_storage_conditions

SLOW_PREP_JOB = str(Path(__file__).with_name("_slow_prep_job.py"))


def run(tmp_path, *, transform="none", job_script=None, epochs=2, images=32, **options):
    req = AnalysisRequest(
        data=f"images:{images}",
        data_dir=tmp_path,
        batch_size=8,
        epochs=epochs,
        transform=transform,
        **options,
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
    reason = probe_storage_conditions(tmp_path)["storage_bandwidth"]
    if reason is not None:
        pytest.fail(f"this test needs a kernel read throttle: {reason}")
    r = run(
        tmp_path,
        workers=1,
        compute="emulated:1",
        cache=CacheSpec(0.5),
        limits=Limits(storage_bandwidth=2_000_000),
        epochs=1,
    )
    b = r.breakdown
    assert b.fetch_stall_seconds > 0.5 * b.epoch_seconds  # 3.7 MB at 2 MB/s, against workers starting
    # all of it, in the kernel's bytes: whole pages, or 512-byte blocks for what the cache admits
    assert 0.95 * r.dataset_bytes <= r.storage_bytes < 1.05 * r.dataset_bytes
    assert r.roofline.bound == "fetch"


@pytest.mark.slow
@pytest.mark.multiproc
def test_cached_data_and_cheap_prep_show_no_stall(tmp_path):
    # an epoch's first batch waits for its worker to be told the new epoch (40-60 ms here): with 4 batches of
    # 80 ms that alone was 10-16% of the epoch, at the 10% a stall is worth acting on; 8 batches of 120 ms
    r = run(tmp_path, workers=1, compute="emulated:120", cache=CacheSpec(1.0), images=64)
    b = r.breakdown
    assert b.prep_stall_seconds + b.fetch_stall_seconds < 0.25 * b.epoch_seconds
    assert "no stall worth acting on" in r.advice


@pytest.mark.slow
@pytest.mark.multiproc
def test_breakdown_adds_up(tmp_path):
    r = run(tmp_path, workers=1, compute="emulated:5", cache=CacheSpec(0.5))
    b = breakdown({run.phase: run for run in r.runs}, r.workload.dataset_bytes)
    pairs = zip(astuple(b), astuple(r.breakdown), strict=True)
    same = [x == y or (math.isnan(x) and math.isnan(y)) for x, y in pairs]
    assert all(same) and math.isnan(b.epoch_spread_seconds)  # one steady epoch: its spread is unknown
    parts = b.compute_seconds + b.prep_stall_seconds + b.fetch_stall_seconds
    assert parts == pytest.approx(b.epoch_seconds, rel=1e-9)  # by construction
    assert b.prep_stall_seconds + b.fetch_stall_seconds == pytest.approx(b.wait_seconds, rel=1e-9)


def _run(phase: str, seconds: float, wait: float, read: int = 1 << 30, jitter: float = 0.0) -> RunRecord:
    epochs = tuple(
        EpochRecord(
            e, seconds + jitter * (e - 2), wait + jitter * (e - 2), seconds - wait, 0.1, 10, 640, read
        )
        for e in (1, 2, 3)
    )
    return RunRecord(phase, epochs, "condition")


def test_the_split_is_of_the_cold_runs_own_wait_and_compute_is_the_rest():
    """The cold epoch waited 5 s of its 9: compute 4 s (1 s of it contention: alone, its steps took 3 s);
    the warm run waited 3 s for the same batches, so 2 s of the cold wait are storage's."""
    runs = {
        "ingestion": _run("ingestion", 5.0, 2.0),
        "prep": _run("prep", 7.0, 3.0),
        "cold": _run("cold", 9.0, 5.0),
    }
    b = breakdown(runs)
    assert (b.epoch_seconds, b.compute_seconds, b.prep_stall_seconds, b.fetch_stall_seconds) == (9, 4, 3, 2)
    assert (b.contention_seconds, b.step_alone_seconds, b.warm_epoch_seconds, b.wait_seconds) == (1, 3, 7, 5)


def test_parts_add_up_when_the_runs_disagree_as_on_a_busy_machine():
    """Separate runs on a busy machine: the ingestion run's steps slower than the whole cold epoch, the warm
    run slower than the cold one. Differences of runs would give 300%; the cold run's own figures do not."""
    runs = {
        "ingestion": _run("ingestion", 30.0, 1.0),
        "prep": _run("prep", 20.0, 12.0),
        "cold": _run("cold", 9.0, 5.0),
    }
    b = breakdown(runs)
    assert b.compute_seconds + b.prep_stall_seconds + b.fetch_stall_seconds == pytest.approx(9.0)
    assert (b.prep_stall_seconds, b.fetch_stall_seconds, b.contention_seconds) == (5.0, 0.0, 0.0)


def test_a_wait_with_nothing_read_is_not_a_fetch_stall():
    runs = {
        "ingestion": _run("ingestion", 5.0, 1.0),
        "prep": _run("prep", 7.0, 1.0),
        "cold": _run("cold", 9.0, 5.0, read=47_000),  # 47 KB of a 44 MB dataset
    }
    b = breakdown(runs, data_bytes=44_000_000)
    assert (b.prep_stall_seconds, b.fetch_stall_seconds) == (5.0, 0.0)
    assert breakdown(runs, data_bytes=1_000_000).fetch_stall_seconds == 4.0  # 4.7% of 1 MB is a read


def test_each_part_carries_its_spread_over_the_epochs():
    runs = {
        "ingestion": _run("ingestion", 5.0, 1.0),
        "prep": _run("prep", 7.0, 3.0),
        "cold": _run("cold", 9.0, 5.0, jitter=0.4),  # epochs 2 and 3: 9.0 and 9.4 s, waits 5.0 and 5.4
    }
    b = breakdown(runs)
    assert b.epoch_spread_seconds == pytest.approx(0.2) and b.fetch_stall_spread_seconds == pytest.approx(0.2)
    assert b.compute_spread_seconds == pytest.approx(0.0) and b.prep_stall_spread_seconds == pytest.approx(
        0.0
    )


def test_transitions_are_parts_of_the_epoch_and_the_first_epochs_extra_is_warm_up():
    """The cold epochs of 9 s each hold 2 s of evaluation (and the first one, 10.5 s, 1.5 s of compilation
    more): compute is 2 s less, the parts still add up, and the compilation is the warm-up's."""
    cold = _run("cold", 9.0, 5.0)
    made = {"evaluation": [2.0, 4]}
    epochs = tuple(replace(e, transitions=dict(made)) for e in cold.epochs)
    first = replace(epochs[0], seconds=10.5, transitions={**made, "compilation": [1.5, 2]})
    epochs = (first, *epochs[1:])
    runs = {
        "ingestion": _run("ingestion", 5.0, 2.0),
        "prep": _run("prep", 7.0, 3.0),
        "cold": replace(cold, epochs=epochs),
    }
    b = breakdown(runs)
    assert (b.compute_seconds, b.transitions) == (2.0, {"evaluation": (2.0, 4.0)})
    assert b.compute_seconds + b.prep_stall_seconds + b.fetch_stall_seconds + b.transition_seconds == 9.0
    assert b.warmup_transitions == {"compilation": (1.5, 2.0)} and b.warmup_seconds == 1.5


def test_a_few_slow_batches_show_in_the_waits_tail():
    """98 batches waited 1 ms and two 200 ms (the first batch, workers starting, left out)."""
    cold = replace(_run("cold", 9.0, 5.0), timeline=((3.0, 0.1), *[(0.001, 0.01)] * 98, *[(0.2, 0.01)] * 2))
    b = breakdown({"ingestion": _run("ingestion", 5.0, 2.0), "prep": _run("prep", 7.0, 3.0), "cold": cold})
    assert b.batch_wait_p50_seconds == pytest.approx(0.001) and b.batch_wait_max_seconds == 0.2
    assert b.batch_wait_p99_seconds > 10 * b.batch_wait_p90_seconds
    assert b.slow_batches == 2 and b.slow_batches_excess_seconds == pytest.approx(2 * 0.199)
    assert b.slow_batches_wait_share == pytest.approx(0.398 / (98 * 0.001 + 0.4))


def test_a_wait_of_microseconds_has_no_slow_batches():
    """4x a median of 10 us is 40 us: under a millisecond, no toll worth naming."""
    cold = replace(_run("cold", 9.0, 5.0), timeline=((3.0, 0.1), *[(1e-5, 0.01)] * 98, *[(5e-4, 0.01)] * 2))
    b = breakdown({"ingestion": _run("ingestion", 5.0, 2.0), "prep": _run("prep", 7.0, 3.0), "cold": cold})
    assert (b.slow_batches, b.slow_batches_excess_seconds, b.slow_batches_wait_share) == (0, 0.0, 0.0)
