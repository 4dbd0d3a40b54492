"""The command's process: started in a session of its own (inside a cgroup where one is given), its stdout
and stderr copied line by line as it runs, stopped at a time limit (SIGTERM, then SIGKILL after a grace
period) and killed whole on Ctrl-C, so no process of its session outlives the run."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

from stallbench.conditions.cgroup import StorageLimits
from stallbench.jobs._session import end_session
from stallbench.jobs.watchdog import ensure_started, unwatch, watch

__all__ = ["CommandProcess"]

_TAIL_LINES = 20  # lines of the command's output kept for an error message
_GRACE = 5.0  # seconds a command gets after SIGTERM (time limit) before it is killed


class CommandProcess:
    """The command's process in a session of its own, its stdout and stderr copied to ours (or both to
    ``log``) line by line, the last lines kept for an error message."""

    def __init__(
        self, argv: Sequence[str], env: dict[str, str], cgroup: StorageLimits | None, log: IO[str] | None
    ) -> None:
        options = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, errors="replace")
        start = cgroup.popen if cgroup is not None else subprocess.Popen
        ensure_started()
        self.proc = start(list(argv), start_new_session=True, **options)
        watch(self.proc.pid)
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._copiers = [
            threading.Thread(target=_copy, args=(stream, log or to, self.tail), daemon=True)
            for stream, to in ((self.proc.stdout, sys.stdout), (self.proc.stderr, sys.stderr))
        ]
        for copier in self._copiers:
            copier.start()

    def wait(self, time_limit: float | None) -> tuple[int, list[str], bool]:
        """(exit code, last lines of both streams, whether ``time_limit`` ended it)."""
        proc, timed_out = self.proc, False
        try:
            try:
                proc.wait(timeout=time_limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop(proc)
        except BaseException:  # Ctrl-C: the whole session goes, then the cgroup (closed by the caller)
            self.kill()
            raise
        finally:
            for copier in self._copiers:
                copier.join(timeout=_GRACE)
            proc.stdout.close()
            proc.stderr.close()
        return proc.returncode, list(self.tail), timed_out

    def kill(self) -> None:
        """The whole session killed and reaped, and the shared memory torch named after its processes
        removed, as a generated job's is (``_session.end_session``); nothing where it has exited and been
        reaped."""
        if self.proc.returncode is None:
            end_session(self.proc.pid, reap=self.proc.wait)
        unwatch(self.proc.pid)


def _copy(stream: IO[str], to: IO[str], tail: collections.deque[str]) -> None:
    """The command's output, line by line, to ``to``; ends quietly when the stream is closed under it
    (a process the command left behind held it open past the command's end)."""
    with contextlib.suppress(ValueError, OSError):
        for line in stream:
            tail.append(line.rstrip("\n"))
            to.write(line)
            to.flush()


def _stop(proc: subprocess.Popen) -> None:
    """The time limit: SIGTERM to the command's session (its epochs so far are written), then SIGKILL."""
    _kill_session(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=_GRACE)
    except subprocess.TimeoutExpired:
        end_session(proc.pid, reap=proc.wait)


def _kill_session(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
