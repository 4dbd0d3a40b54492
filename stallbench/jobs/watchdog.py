"""Jobs that end when the stallbench that started them is killed with SIGKILL.

A job runs in a session of its own (``_session.py``, ``_process.py``), so nothing kills it with stallbench:
a stallbench killed with SIGKILL, which runs no handler, would leave it running with its workers, its
cgroups and scratch folders. So each stallbench process that starts a job first starts one watchdog, a
process in a session of its own that reads the sessions stallbench has running from a pipe stallbench alone
writes to (a forked child drops its copy). When that pipe ends (stallbench has exited, however), the
watchdog kills each session still listed (a stallbench that ended normally has ended them all), then
removes what the run left (``leftovers.sweep``). It waits in a blocking read: no CPU while stallbench
lives. A watchdog killed with its run (a whole process tree killed) leaves that to the next run, which
sweeps before it starts its own; one killed alone is replaced for the jobs started after.

    python stallbench/jobs/watchdog.py PID   (stdin: lines "+SID" and "-SID")
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

__all__ = ["ensure_started", "unwatch", "watch"]

_lock = threading.Lock()
_pipe: int | None = None  # the write end; a forked child drops it
_watchdogs: list[subprocess.Popen] = []  # held for good: it ends after this process, never waited for


def ensure_started() -> None:
    """This process's watchdog started, if not yet: called before a job starts, so that no moment passes
    between the job's start and its watch."""
    with _lock:
        _write_end()


def watch(sid: int) -> None:
    """Session ``sid`` (a job's) is killed if this process dies before ``unwatch(sid)``."""
    _send(f"+{sid}\n")


def unwatch(sid: int) -> None:
    """Session ``sid`` has been ended: the watchdog forgets it."""
    _send(f"-{sid}\n")


def _send(line: str) -> None:
    global _pipe
    with _lock:
        try:
            os.write(_write_end(), line.encode())
        except BrokenPipeError:  # the watchdog was killed alone: a new one for the jobs started from now
            os.close(_write_end())
            _pipe = None
            if line.startswith("+"):
                with contextlib.suppress(BrokenPipeError):
                    os.write(_write_end(), line.encode())


def _forget_in_child() -> None:
    """A forked child holds no write end of its parent's pipe (the watchdog waits for every one to close)
    and starts its own watchdog where it starts a job."""
    global _pipe, _lock
    if _pipe is not None:
        with contextlib.suppress(OSError):
            os.close(_pipe)
    _pipe, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def _write_end() -> int:
    """The write end of this process's watchdog's pipe, the watchdog started first where there is none."""
    global _pipe
    if _pipe is None:
        _pipe = _start()
    return _pipe


def _start() -> int:
    """A watchdog for this process, what dead runs left removed first; the write end of its pipe, which no
    child of ours inherits."""
    from stallbench.jobs.leftovers import sweep
    from stallbench.jobs.run import importable_env

    sweep()
    read, write = os.pipe()
    try:
        argv = [sys.executable, os.path.abspath(__file__), str(os.getpid())]  # no import until it must act
        _watchdogs.append(subprocess.Popen(argv, stdin=read, start_new_session=True, env=importable_env()))
    finally:
        os.close(read)
    return write


def _serve(parent: int) -> None:
    """Until the pipe ends; then the sessions still listed are killed and the run's leftovers removed."""
    running: set[int] = set()
    for line in sys.stdin.buffer:
        sid = int(line[1:])
        if line.startswith(b"+"):
            running.add(sid)
        else:
            running.discard(sid)
    from stallbench.jobs._session import end_session
    from stallbench.jobs.leftovers import sweep

    for sid in running:
        if _leads_its_session(sid):
            end_session(sid)
    sweep(parent)  # killed between two jobs, it left its folders too; ended normally, nothing is left


def _leads_its_session(sid: int) -> bool:
    """Whether ``sid`` is still a session's leader (the job's, not a process given its pid since)."""
    try:
        return os.getsid(sid) == sid
    except OSError:
        return False


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
