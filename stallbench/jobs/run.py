"""Running scripts as subprocesses (the parent side), inside kernel-enforced limits when asked, and the
folders every job gets: a private ``TMPDIR`` (``job_tmpdir``), this checkout importable (``child_env``), a
fresh cache folder per run (``scratch_cache_dir``).

Jobs stallbench measures, generated or the user's own, run through ``stallbench.jobs.command``; ``run_job``
runs a script that measures itself and prints one JSON object per line on stdout (the benchmarks'
hand-timed witnesses, whose figures stallbench's are checked against).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stallbench.conditions.cgroup import StorageLimits
from stallbench.jobs._session import session
from stallbench.jobs.leftovers import JOB_TMP_PREFIX, RUN_PREFIX, sweep_folders

__all__ = [
    "JobFailed",
    "child_env",
    "importable_env",
    "job_tmpdir",
    "run_job",
    "scratch_cache_dir",
]

REPO = Path(__file__).resolve().parents[2]  # the folder that holds this checkout's stallbench and loader
_TAIL = 2_000  # characters of a failed job's stderr kept in the error
_SUN_PATH = 107  # bytes of a Unix socket's path (sun_path, less its NUL)
_SOCKET, _TMP_NAME = len("/pymp-XXXXXXXX/listener-XXXXXXXX"), len(f"/{JOB_TMP_PREFIX}-4194304-XXXXXXXX")


class JobFailed(RuntimeError):
    """A loader job exited with an error; the message holds the end of its stderr."""


def run_job(argv: Sequence[str], limits: StorageLimits | None = None, timeout: float = 600) -> list[dict]:
    """Run a script that measures itself (inside ``limits`` when given) and return the JSON objects it
    printed, one per line.

    The script gets a private ``TMPDIR``, removed when it is done: a DataLoader worker creates a ``pymp-*``
    folder there (``multiprocessing.util.get_temp_dir``, for sharing tensors) and leaves it behind when it is
    killed (an interrupted run, a cgroup's sweep) rather than let to exit.
    """
    run = limits.run if limits is not None else _run_in_session
    tmp = job_tmpdir()
    try:
        done = run(list(argv), capture_output=True, text=True, timeout=timeout, env=child_env(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if done.returncode != 0:
        where = " inside the cgroup" if limits is not None else ""
        raise JobFailed(f"{' '.join(argv[1:4])}... exited {done.returncode}{where}:\n{done.stderr[-_TAIL:]}")
    return _records(done.stdout)


def _records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


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
    return tempfile.mkdtemp(prefix=f"{JOB_TMP_PREFIX}-{os.getpid()}-", dir=fits[0] if fits else None)


def child_env(tmpdir: str | os.PathLike, first: Sequence[str | os.PathLike] = ()) -> dict[str, str]:
    """This environment for a child: ``first`` then this checkout importable, ``TMPDIR`` set to ``tmpdir``."""
    return {**importable_env(first), "TMPDIR": os.fspath(tmpdir)}


def importable_env(first: Sequence[str | os.PathLike] = ()) -> dict[str, str]:
    """This environment with ``first`` then this checkout importable (a checkout run without installing)."""
    paths = [*map(os.fspath, first), str(REPO), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def scratch_cache_dir(parent: str | os.PathLike | None = None) -> Path:
    """A fresh private folder for one run's cache in ``parent`` (None: where the loader keeps its caches by
    default, ``loader.system.home``); the caller removes it (``shutil.rmtree``). Folders of this user's
    earlier runs whose process is gone (killed before it could remove them) are removed first."""
    if parent is None:
        from loader.system.home import default_cache_dir  # here: the command line starts without torch

        parent = default_cache_dir()
    sweep_folders(Path(parent), RUN_PREFIX)
    return Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}-{os.getpid()}-", dir=parent))
