"""Running jobs as subprocesses (the parent side), inside kernel-enforced limits when asked.

A generated job (:func:`run_workload`) is ``python -m stallbench.jobs.workload JOB.json``, or ``python SCRIPT
JOB.json`` for a script that calls ``stallbench.jobs.workload.main`` with a transform of its own; its
:class:`~stallbench.jobs.spec.WorkloadJob` goes as JSON in that file. Any job prints one JSON object per
epoch on stdout (:func:`run_job` returns them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stallbench.conditions.cgroup import StorageLimits
from stallbench.jobs._session import session
from stallbench.jobs.spec import WorkloadJob

__all__ = [
    "JobFailed",
    "StartedJob",
    "child_env",
    "job_tmpdir",
    "run_job",
    "run_workload",
    "scratch_cache_dir",
]

REPO = Path(__file__).resolve().parents[2]  # the folder that holds this checkout's stallbench and loader
_TAIL = 2_000  # characters of a failed job's stderr kept in the error
_SUN_PATH = 107  # bytes of a Unix socket's path (sun_path, less its NUL)
_SOCKET, _TMP_NAME = len("/pymp-XXXXXXXX/listener-XXXXXXXX"), len("/sb-XXXXXXXX")


class JobFailed(RuntimeError):
    """A loader job exited with an error; the message holds the end of its stderr."""


def run_workload(
    job: WorkloadJob,
    limits: StorageLimits | None = None,
    *,
    script: str | os.PathLike | None = None,
    timeout: float = 600,
) -> list[dict]:
    """Run the generated ``job`` (through ``script`` when given) and return its per-epoch records."""
    argv = [sys.executable, *([os.fspath(script)] if script else ["-m", "stallbench.jobs.workload"])]
    return run_job(argv, limits, timeout, job=job)


def run_job(
    argv: Sequence[str],
    limits: StorageLimits | None = None,
    timeout: float = 600,
    *,
    job: WorkloadJob | None = None,
) -> list[dict]:
    """Run a job (inside ``limits`` when given) and return its per-epoch records; with ``job``, its JSON file
    is the last argument.

    The job gets a private ``TMPDIR``, removed when it is done: a DataLoader worker creates a ``pymp-*``
    folder there (``multiprocessing.util.get_temp_dir``, for sharing tensors) and leaves it behind when it is
    killed (an interrupted run, a cgroup's sweep) rather than let to exit. The job's JSON file goes there too.
    """
    run = limits.run if limits is not None else _run_in_session
    tmp = job_tmpdir()
    try:
        if job is not None:
            argv = [*argv, str(job.write(Path(tmp) / "workload.json"))]
        done = run(list(argv), capture_output=True, text=True, timeout=timeout, env=child_env(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if done.returncode != 0:
        where = " inside the cgroup" if limits is not None else ""
        what = f"{' '.join(argv[1:-1])} ({job.loader}, {job.mode})" if job else f"{' '.join(argv[1:4])}..."
        raise JobFailed(f"{what} exited {done.returncode}{where}:\n{done.stderr[-_TAIL:]}")
    return _records(done.stdout)


def _records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


class StartedJob:
    """A generated job started and not waited for, so that several run at once (``compare --jobs``).

    It runs in a session of its own, as :func:`run_job`'s do, with a private ``TMPDIR`` that also takes its
    stdout and stderr: files, not pipes, so no job blocks on a full pipe while the parent waits on another.
    :meth:`stop` kills the whole session (the job and its workers), reaps it and removes that folder.
    """

    def __init__(self, job: WorkloadJob) -> None:
        self.job, self.tmp = job, Path(job_tmpdir())
        argv = [sys.executable, "-m", "stallbench.jobs.workload", str(job.write(self.tmp / "workload.json"))]
        self._session = contextlib.ExitStack()  # closed by ``stop``: the session killed whole and reaped
        try:
            with open(self.tmp / "stdout", "wb") as out, open(self.tmp / "stderr", "wb") as err:
                started = session(argv, stdout=out, stderr=err, env=child_env(self.tmp))
                self.proc = self._session.enter_context(started)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""
        return self.proc.poll()

    def records(self) -> list[dict]:
        """Its per-epoch records, once it has exited; JobFailed with the end of its stderr if it failed."""
        code = self.proc.wait()
        if code != 0:
            err = (self.tmp / "stderr").read_text(errors="replace")
            raise JobFailed(f"a {self.job.loader} job exited {code}:\n{err[-_TAIL:]}")
        return _records((self.tmp / "stdout").read_text())

    def stop(self) -> None:
        self._session.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _run_in_session(
    argv: list[str], *, capture_output: bool, timeout: float, **options: Any
) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a session of its own, killed whole when done or interrupted: killing only the job
    (as ``subprocess.run`` does on Ctrl-C) would leave its DataLoader workers running until their watchdog
    notices, seconds later."""
    if capture_output:
        options.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with session(argv, **options) as proc:
        out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def job_tmpdir() -> str:
    """A fresh folder for a job's ``TMPDIR``, in this one (``tempfile.gettempdir()``) or else in /tmp.

    A worker's socket goes at ``<TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX``, and a Unix socket's path has at
    most 107 bytes: a deeper one cannot be bound, the worker cannot send its batch and the job hangs."""
    bases = (tempfile.gettempdir(), "/tmp")
    fits = [base for base in bases if len(os.fsencode(base)) + _TMP_NAME + _SOCKET <= _SUN_PATH]
    return tempfile.mkdtemp(prefix="sb-", dir=fits[0] if fits else None)


def child_env(tmpdir: str | os.PathLike, first: Sequence[str | os.PathLike] = ()) -> dict[str, str]:
    """This environment for a child: ``first`` then this checkout importable, ``TMPDIR`` set to ``tmpdir``."""
    paths = [*map(os.fspath, first), str(REPO), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths)), "TMPDIR": os.fspath(tmpdir)}


def scratch_cache_dir(parent: str | os.PathLike = "/dev/shm") -> Path:
    """A fresh private folder for one run's cache; the caller removes it (``shutil.rmtree``). Folders of
    this user's earlier runs whose process is gone (killed before it could remove them) are removed first."""
    _sweep_dead_runs(Path(parent))
    return Path(tempfile.mkdtemp(prefix=f"stallbench-run-{os.getpid()}-", dir=parent))


def _sweep_dead_runs(parent: Path) -> None:
    """Remove ``stallbench-run-<pid>-*`` folders of ``parent`` that this user owns and whose ``pid`` is gone;
    another user's, a link, or a live process's are left alone."""
    for entry in parent.glob("stallbench-run-*-*"):
        with contextlib.suppress(ValueError, OSError):
            st = entry.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            try:
                os.kill(int(entry.name.split("-")[2]), 0)
            except ProcessLookupError:
                shutil.rmtree(entry, ignore_errors=True)
