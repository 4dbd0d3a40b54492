"""Coordinated prep across separate jobs: three processes started as a user starts them, one killed, one slow,
one late; every job gets every batch exactly once, in the group's order, and nothing stays in /dev/shm."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from loader.coordinated.area import MIN_LOCK_WAIT
from loader.system.home import default_cache_dir
from tests._data import make_image_folder

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

JOB = Path(__file__).with_name("_coordinated_job.py")
REPO = JOB.parent.parent
SAMPLES = 96  # 12 batches of 8
_started: list[subprocess.Popen] = []  # this test's jobs: killed, with their workers, whatever the outcome


@pytest.fixture(autouse=True)
def _kill_what_the_test_started():
    """Every job a test started is gone when it ends: one that failed (a job held past its patience) left
    its jobs running, and the rest of the suite beside them (seen once: the next tests met their zombie)."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                for p in tree:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.resume()
                        p.kill()
            proc.communicate()


def start(tmp_path: Path, name: str, own_group: bool = False, **config) -> subprocess.Popen:
    """A job; ``own_group``: in a process group of its own, so that it can be stopped whole."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(JOB.parent)])}
    proc = subprocess.Popen(
        [sys.executable, str(JOB), str(path)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=own_group,
    )
    _started.append(proc)
    return proc


def finish(proc: subprocess.Popen) -> tuple[list[dict], dict, str]:
    """(epochs, stats, stderr) of a job that must end well within two minutes."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [r for r in lines if "epoch" in r], next(r["stats"] for r in lines if "stats" in r), err


def wait_for_line(proc: subprocess.Popen, line: str) -> None:
    while (seen := proc.stdout.readline()) and seen.strip() != line:
        pass
    assert seen, f"the job ended before printing {line!r}"


def every_sample_once(epoch: dict) -> bool:
    return sorted(i for batch in epoch["indices"] for i in batch) == list(range(SAMPLES))


@pytest.fixture(params=["indexed", "images"])
def data(request, tmp_path: Path) -> str:
    if request.param == "indexed":
        return "indexed"
    make_image_folder(tmp_path / "images", {"a": 48, "b": 48})
    return str(tmp_path / "images")


def test_three_jobs_take_the_same_batches_in_the_same_order_each_prepared_once(tmp_path, shm_dir, data):
    config = dict(data=data, samples=SAMPLES, group="three", staging=str(shm_dir), epochs=2, min_members=3)
    jobs = [start(tmp_path, f"job{k}", **config) for k in range(3)]
    results = [finish(job) for job in jobs]
    epochs = [r[0] for r in results]
    assert epochs[0] == epochs[1] == epochs[2]  # the whole of every batch, in order
    assert [len(e["digests"]) for e in epochs[0]] == [12, 12]
    assert len({d for e in epochs[0] for d in e["digests"]}) == 24  # two epochs, 24 different batches
    if data == "indexed":
        assert all(every_sample_once(e) for e in epochs[0])
    stats = [r[1] for r in results]
    assert sum(s["batches_prepared"] for s in stats) == 24  # each batch prepared by one job only
    assert all(s["batches_consumed"] == 24 and s["status"] == "member" for s in stats)
    assert sum(s["prep_cpu_saved_seconds"] for s in stats) > 0
    assert not list(shm_dir.iterdir())


def test_a_job_killed_mid_epoch_leaves_the_others_every_batch_exactly_once(tmp_path, shm_dir):
    config = dict(
        data="indexed", samples=SAMPLES, group="kill", staging=str(shm_dir), epochs=2, min_members=3
    )
    victim = start(tmp_path, "victim", **config, step=0.05)
    others = [start(tmp_path, f"job{k}", **config, step=0.02) for k in range(2)]
    wait_for_line(victim, "batch 0 3")
    victim.send_signal(signal.SIGKILL)  # as the OOM killer does: the main process only, workers orphaned
    victim.communicate()
    results = [finish(job) for job in others]
    assert results[0][0] == results[1][0]
    assert all(every_sample_once(e) for e in results[0][0]) and len(results[0][0]) == 2
    assert all(r[1]["batches_consumed"] == 24 for r in results)
    deadline = time.monotonic() + 10  # the victim's orphaned worker notices its parent is gone
    while list(shm_dir.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list(shm_dir.iterdir())


def test_a_slow_job_is_detached_and_goes_on_alone(tmp_path, shm_dir):
    config = dict(
        data="indexed", samples=SAMPLES, group="slow", staging=str(shm_dir), epochs=2, min_members=3
    )
    config.update(staged=2, patience=0.5)
    slow = start(tmp_path, "slow", **config, step=0.4)
    fast = [start(tmp_path, f"fast{k}", **config) for k in range(2)]
    fast_results = [finish(job) for job in fast]
    slow_epochs, slow_stats, slow_err = finish(slow)
    assert "goes on alone" in slow_err and slow_stats["status"].startswith("alone")
    assert fast_results[0][0] == fast_results[1][0]
    assert all(every_sample_once(e) for r in (*fast_results, (slow_epochs,)) for e in r[0])
    # the slow job's first epoch is the group's order, the part it took before it left and the rest alone
    assert slow_epochs[0]["indices"] == fast_results[0][0][0]["indices"]
    assert not list(shm_dir.iterdir())


@pytest.mark.parametrize("moment", ["batch 0 3", "batch 0 11"], ids=["mid-epoch", "at-the-epoch-end"])
def test_a_stopped_job_holds_the_others_no_longer_than_its_patience(tmp_path, shm_dir, moment):
    patience = 2.0
    config = dict(
        data="indexed", samples=SAMPLES, group="stop", staging=str(shm_dir), epochs=3, min_members=3
    )
    config.update(patience=patience, staged=4, workers=2)
    victim = start(tmp_path, "victim", own_group=True, **config, step=0.05)
    others = [start(tmp_path, f"job{k}", **config, step=0.02) for k in range(2)]
    wait_for_line(victim, moment)
    os.killpg(victim.pid, signal.SIGSTOP)  # the whole job, workers too, as a scheduler or a debugger stops it
    stopped = time.monotonic()
    allowed = 3 * patience + MIN_LOCK_WAIT  # stopped inside the table's lock (microseconds, rarely), it holds
    try:  # the others MIN_LOCK_WAIT; else they finish while it is stopped, within 3x its patience
        for job in others:
            job.wait(timeout=max(0.1, stopped + allowed - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the others were still held {allowed:g} s after the stop (patience {patience:g} s)")
    finally:
        os.killpg(victim.pid, signal.SIGCONT)
    results = [finish(job) for job in others]
    victim_epochs, victim_stats, victim_err = finish(victim)
    assert all(len(r[0]) == 3 for r in results)
    assert all(every_sample_once(e) for r in (*results, (victim_epochs,)) for e in r[0])
    assert len(victim_epochs) == 3
    locked_out = any("held the lock" in r[2] for r in results)  # stopped inside the lock: each went alone,
    if not locked_out:  # from where it was, so their later orders are their own, and the victim, found a
        # member still when it goes on, finishes as one; else they stay one group and it was detached
        assert results[0][0] == results[1][0]
        assert all(r[1]["batches_consumed"] == 36 and r[1]["status"] == "member" for r in results)
        said = (victim_err, victim_stats, [r[2] for r in results])
        assert "goes on alone" in victim_err and victim_stats["status"].startswith("alone"), said
    assert not list(shm_dir.iterdir())


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def test_a_process_stopped_holding_the_table_s_lock_holds_no_job_beyond_its_patience(tmp_path, shm_dir):
    """The lock is held for microseconds; here another process takes it mid-epoch and is stopped there."""
    patience = 5.0  # the least a lock is waited for
    config = dict(
        data="indexed", samples=SAMPLES, group="lock", staging=str(shm_dir), epochs=2, min_members=2
    )
    config.update(patience=patience, staged=4, workers=2)
    jobs = [start(tmp_path, f"job{k}", **config, step=0.05) for k in range(2)]
    wait_for_line(jobs[0], "batch 0 3")
    (lock,) = shm_dir.glob("*/lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGSTOP)
        held = time.monotonic()
        for job in jobs:  # each goes on alone once the lock was waited for its patience
            job.wait(timeout=max(0.1, held + 4 * patience - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the jobs were still held {4 * patience:g} s after the lock's holder stopped")
    finally:
        holder.kill()
        holder.communicate()
    results = [finish(job) for job in jobs]
    assert all("goes on alone: another process held the lock" in err for _, _, err in results)
    assert all(len(epochs) == 2 and all(map(every_sample_once, epochs)) for epochs, _, _ in results)
    finish(start(tmp_path, "after", **{**config, "min_members": 1, "epochs": 1}))  # sweeps what they left
    assert not list(shm_dir.iterdir())


def test_a_job_that_comes_mid_epoch_joins_at_the_next_epoch(tmp_path, shm_dir):
    # two staged batches: the group's next epoch is not begun before this one's end, so "mid-epoch" is sure
    config = dict(data="indexed", samples=SAMPLES, group="late", staging=str(shm_dir), staged=2)
    go = tmp_path / "go"
    late = start(tmp_path, "late", **config, epochs=2, go=str(go))
    wait_for_line(late, "ready")  # its imports done: it joins the moment it is told
    first = start(tmp_path, "first", **config, epochs=3, step=0.2)
    wait_for_line(first, "batch 0 4")
    go.touch()
    first_epochs, _, _ = finish(first)
    late_epochs, late_stats, late_err = finish(late)
    assert "mid-epoch" in late_err and late_stats["status"] == "member"
    assert every_sample_once(late_epochs[0]) and late_epochs[0] != first_epochs[0]  # alone, its own order
    # then the group's next epoch from its first batch (the first job may be in its second epoch already)
    assert late_epochs[1]["digests"] in [e["digests"] for e in first_epochs[1:]]
    assert not list(shm_dir.iterdir())


def test_with_the_default_staging_dir_nothing_stays_there_nor_in_dev_shm(tmp_path):
    places = (Path("/dev/shm"), default_cache_dir())
    before = {p for place in places for p in place.glob("stallbench-coord-*")}
    config = dict(data="indexed", samples=SAMPLES, group=f"default-{os.getpid()}", staging=None)
    jobs = [
        start(tmp_path, f"job{k}", **config, epochs=1, min_members=2, workers=2, persistent=True)
        for k in range(2)
    ]
    results = [finish(job) for job in jobs]
    assert results[0][0] == results[1][0]
    assert {p for place in places for p in place.glob("stallbench-coord-*")} == before
