"""A child process in a session of its own, killed whole with everything it started, Ctrl-C or not, and the
shared memory torch names after its processes removed with them.

Torch makes a tensor's shared memory under ``/dev/shm/torch_<pid>_...`` and unlinks the name at once; a
process killed between the two leaves the name for good (seen once in 1,300 tests: a job killed whole while
its worker sent a batch). The names left by the session's processes, this user's, go when it is killed: the
session is stopped before its processes are listed (one forked after the list would be killed unnamed), and
swept once every one of them has ended (one killed inside its ``open`` of a name still makes the name)."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psutil

from stallbench._held_signals import hold_signals, release_signals
from stallbench.jobs.watchdog import ensure_started, unwatch, watch

__all__ = ["end_session", "remove_torch_segments", "session"]


@contextlib.contextmanager
def session(argv: Sequence[str], **options: Any) -> Iterator[subprocess.Popen]:
    """``argv`` started in a session of its own, which is killed whole (the process and all it started)
    when the block ends, however it ends. Ctrl-C, SIGTERM and SIGHUP are held back while the process starts:
    landing between its start and this block, they would leave the process running, unkilled."""
    ensure_started()
    held = hold_signals()
    try:
        proc = subprocess.Popen(list(argv), start_new_session=True, **options)
    except BaseException:
        release_signals(held)
        raise
    with proc:
        try:
            watch(proc.pid)
            release_signals(held)  # a signal held back acts here, where the kill below is armed
            yield proc
        finally:
            end_session(proc.pid, reap=proc.wait)
            unwatch(proc.pid)


def end_session(sid: int, reap: Callable[[], object] = lambda: None) -> None:
    """Every process of the session that ``sid`` leads killed (``reap``: its leader's parent waits for it
    there), then the shared memory torch named after them removed."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGSTOP)  # none of them forks another once listed
    pids = _tree(sid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    reap()  # killed: at once
    _wait_ended(pids)  # one killed inside its open of a name makes the name first: sweep after
    remove_torch_segments(pids)


def _tree(pid: int) -> list[int]:
    """``pid`` and every process under it now."""
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


def _wait_ended(pids: list[int], timeout: float = 5.0) -> None:
    """Until each of ``pids`` has ended (gone, or a zombie: it runs no more), ``timeout`` at most."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    deadline = time.monotonic() + timeout
    while procs and time.monotonic() < deadline:
        procs = [p for p in procs if _running(p)]
        time.sleep(0.01 if procs else 0)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def remove_torch_segments(pids: Iterable[int], shm: str = "/dev/shm") -> None:
    """Unlink the shared memory torch named after these (killed) processes, where this user owns it."""
    for pid in pids:
        for path in glob.glob(os.path.join(shm, f"torch_{pid}_*")):
            with contextlib.suppress(OSError):
                if os.lstat(path).st_uid == os.getuid():
                    os.unlink(path)
