"""The suite's /dev/shm leak check (``conftest.no_shm_leak``) on a shared machine: what other users' live
processes make there meanwhile is theirs, not a leak; what a process of this session makes is (issue 46)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import _MAKER, SHM, _others

JOB = Path(__file__).with_name("_other_user_loader.py")


def _tree(jobs: list[int]) -> set[int]:
    """The processes of ``jobs`` now: each job and its workers."""
    pids = set(jobs)
    for job in jobs:
        with contextlib.suppress(psutil.Error):
            pids.update(child.pid for child in psutil.Process(job).children(recursive=True))
    return pids


def _names_of(pids: set[int]) -> set[str]:
    """The names in /dev/shm that ``pids`` made (a worker makes torch's)."""
    return {name for name in os.listdir(SHM) if (made := _MAKER.match(name)) and int(made[1]) in pids}


@pytest.fixture(scope="module")
def other_users_loaders(tmp_path_factory) -> Iterator[list[int]]:
    """Two training jobs that are no process of this session's, running through this module's tests and
    their leak checks (a module's fixture outlives a test's); killed after, their names removed."""
    folder, pids = tmp_path_factory.mktemp("others"), []
    try:
        for n in range(2):
            pidfile = folder / f"pid{n}"
            subprocess.run([sys.executable, str(JOB), str(pidfile), str(os.getpid())], check=True, timeout=30)
            deadline = time.monotonic() + 60
            while not (pidfile.exists() and pidfile.read_text()):
                assert time.monotonic() < deadline, "the other user's job did not start"
                time.sleep(0.05)
            pids.append(int(pidfile.read_text()))
        yield pids
    finally:
        tree = _tree(pids)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        for name in _names_of(tree):
            path = SHM / name
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink()


@pytest.mark.multiproc
def test_other_users_loaders_making_names_during_the_check_are_not_a_leak(other_users_loaders):
    deadline = time.monotonic() + 30
    while not any(name.startswith("torch_") for name in _names_of(_tree(other_users_loaders))):
        assert time.monotonic() < deadline, "the other users' loaders share no batch by name"
        time.sleep(0.01)
    named = _names_of(_tree(other_users_loaders))
    assert named and all(_others(name) for name in named)


@pytest.mark.multiproc
def test_a_name_one_of_this_session_s_processes_made_is_a_leak():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not _others(f"torch_{child.pid}_1") and not _others(f"stallbench-run-{child.pid}-x")
    finally:
        child.kill()
        child.wait()
