"""``stallbench.jobs.run``: a job runs with its own TMPDIR, removed whatever the job leaves in it; a generated
job's WorkloadJob goes to it as JSON, and one that fails is named; the counters keep what exited children
used."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from loader.system.counters import cpu_seconds
from stallbench.analysis.memory import OVERHEAD_MARGIN, memory_limit
from stallbench.cli.stops import stops_as_ctrl_c
from stallbench.jobs.command import CommandFailed, run_command
from stallbench.jobs.run import run_job, scratch_cache_dir
from stallbench.jobs.spec import JobSpec, WorkloadJob

# A DataLoader worker shares a tensor through a listener socket in multiprocessing's temp dir
# (pymp-*/listener-*), which it removes only when it exits normally: this job makes one and dies as a
# killed worker does.
_LEAVES_PYMP = """
import json, multiprocessing.connection, os, sys
listener = multiprocessing.connection.Listener()
print(json.dumps({"tmpdir": os.environ["TMPDIR"], "socket": listener.address}), flush=True)
os._exit(int(sys.argv[1]))
"""


@pytest.fixture(params=["short", "long"])
def scratch(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temporary folder for the test (short, or one too deep for a socket below it)."""
    folder = tmp_path / ("t" if request.param == "short" else "t" * 80)
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    return folder


def test_a_job_gets_a_private_tmpdir_that_is_removed(scratch: Path) -> None:
    (record,) = run_job([sys.executable, "-c", _LEAVES_PYMP, "0"])
    tmpdir = Path(record["tmpdir"])
    assert Path(record["socket"]).parent.parent == tmpdir and not tmpdir.exists()
    # sun_path's limit, for the longest pid the kernel gives and the job's own folder and socket names
    socket_fits = len(f"{scratch}/sb-4194304-XXXXXXXX/pymp-XXXXXXXX/listener-XXXXXXXX") <= 107
    assert tmpdir.parent == (scratch if socket_fits else Path("/tmp"))
    assert not list(scratch.iterdir())


def test_a_failed_job_leaves_no_tmpdir_either(scratch: Path) -> None:
    with pytest.raises(RuntimeError, match="exited 3"):
        run_job([sys.executable, "-c", _LEAVES_PYMP, "3"])
    assert not list(scratch.iterdir())


_WORKER = "import time; time.sleep(61)"
# A job that exits (or is interrupted) with a worker still running, as a killed job's DataLoader worker is
_LEAVES_WORKER = """
import json, subprocess, sys, time
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # its end is not waited for on a pipe
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(61)"], **quiet)
print(json.dumps({"worker": worker.pid}), flush=True)
time.sleep(float(sys.argv[1]))
"""


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_job_goes_with_every_process_it_started(interrupted: bool) -> None:
    if interrupted:  # as by Ctrl-C: an exception while the job runs
        with pytest.raises(subprocess.TimeoutExpired):
            run_job([sys.executable, "-c", _LEAVES_WORKER, "60"], timeout=3)
    else:
        run_job([sys.executable, "-c", _LEAVES_WORKER, "0"])
    deadline = time.monotonic() + 1.0  # SIGKILL is sent before run_job returns; the kernel acts on it at once
    while (left := _live_workers()) and time.monotonic() < deadline:
        time.sleep(0.01)
    for proc in left:  # not to outlive a failed test
        proc.kill()
    assert not left


def _live_workers() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if (proc.info["cmdline"] or [])[-1:] == [_WORKER] and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


@pytest.mark.parametrize("cache", [0, 100 << 20, 4 << 30, 40 << 30])
def test_the_memory_limit_leaves_the_cache_its_budget_beside_the_reserve_it_keeps(cache):
    from loader.system import reserve_for_limit

    overheads = {"torch": 300 << 20, "cached": 250 << 20}
    base = cache + (300 << 20) + OVERHEAD_MARGIN
    limit = memory_limit(cache, overheads, workers=1)
    own = base - cache  # the job's memory and the margin
    assert limit - reserve_for_limit(limit, own) >= base  # the cache can fill to its budget before it pauses
    assert limit - reserve_for_limit(limit, own) < base + (2 << 20)  # and the page cache no more


def test_a_workload_job_goes_to_the_child_as_json_and_back():
    job = WorkloadJob("cached", Path("/data"), cache_bytes="auto", cache_dir=Path("/dev/shm/x"), seed=3)
    assert (job.data, job.cache_dir) == ("/data", "/dev/shm/x")
    assert WorkloadJob.from_json(job.to_json()) == job
    with pytest.raises(ValueError, match=r"unknown WorkloadJob fields: \['worker'\]"):
        WorkloadJob.from_json('{"loader": "torch", "data": "d", "worker": 2}')


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"loader": "tf"}, "unknown loader 'tf'; choose one of: torch, cached"),
        ({"transform": "crop"}, "transform must be 'train', 'eval' or 'none', got 'crop'"),
        ({"cache_bytes": "1G"}, "cache_bytes must be bytes, 'auto' or None, got '1G'"),
    ],
)
def test_a_workload_job_refuses_what_the_child_cannot_run(option, message):
    with pytest.raises(ValueError, match=message):
        WorkloadJob(**{"loader": "torch", "data": "d", **option})


def test_a_failed_generated_job_names_its_command_and_what_it_said(tmp_path: Path) -> None:
    spec = JobSpec(out_dir="", mode="ingestion")
    job = WorkloadJob("torch", tmp_path / "nowhere")
    with pytest.raises(CommandFailed, match=r"stallbench.jobs.workload .*workload.json` exited with code 1"):
        run_command([sys.executable, "-m", "stallbench.jobs.workload"], spec, job=job)


def test_the_cpu_counter_keeps_a_child_that_has_exited():
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", burn], check=True)  # reaped here: no longer in the process tree
    assert cpu_seconds() - before >= 0.3


@pytest.fixture
def stops_as_stallbench():
    """SIGTERM and SIGHUP in this process as in stallbench's (``stops``), and SIGINT as Python sets it where
    it is not ignored, whatever the shell running the tests ignores (a background shell ignores SIGINT: each
    of the 20 jobs then ran to its timeout, 100 s); put back after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with stops_as_ctrl_c():
            yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.multiproc
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)  # SIGHUP: alike
def test_a_stop_at_any_moment_of_a_jobs_start_leaves_nothing_running(signum, stops_as_stallbench) -> None:
    """The signal lands at 20 moments spread over the start of a job (before, during and after its Popen)."""
    for k in range(20):
        timer = threading.Timer(0.002 * k, os.kill, (os.getpid(), signum))
        with contextlib.suppress(KeyboardInterrupt, subprocess.TimeoutExpired):
            timer.start()
            run_job([sys.executable, "-c", _LEAVES_WORKER, "60"], timeout=5)
            timer.join()  # a signal after the job's end lands here
            time.sleep(0.01)
        timer.join()
        deadline = time.monotonic() + 1.0
        while (left := _live_workers()) and time.monotonic() < deadline:
            time.sleep(0.01)
        for proc in left:
            proc.kill()
        assert not left, f"a worker outlived an interrupt at {0.002 * k:.3f} s"


def test_a_killed_runs_scratch_folder_is_swept_by_the_next_run(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"stallbench-run-{gone.pid}-abc123"
    live = tmp_path / f"stallbench-run-{os.getpid()}-def456"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "minio-x").mkdir()
    (tmp_path / f"stallbench-run-{gone.pid}-link").symlink_to(live)  # a link is never followed nor removed
    made = scratch_cache_dir(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([made.name, live.name, f"stallbench-run-{gone.pid}-link"])
    assert (live / "minio-x").is_dir()
