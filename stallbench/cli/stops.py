"""SIGTERM and SIGHUP end stallbench as Ctrl-C does.

A scheduler ends a job with SIGTERM (SLURM's ``scancel`` and time limit, ``timeout``, systemd, Kubernetes), a
closed terminal with SIGHUP. Python's default for both kills the process where it stands: the jobs stallbench
runs, each in a session of its own, would go on with their workers, cgroups and scratch folders. Here both
raise :class:`Stopped`, a ``KeyboardInterrupt``, in the main thread, so every path that ends a run on Ctrl-C
(its jobs' sessions killed, cgroups and scratch folders removed, what was measured so far printed and
written) ends it on these too; the exit status says which signal it was, as a shell's would (128 + number).
A signal ignored when stallbench started (``nohup``) stays ignored.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Stopped", "exit_status", "say_stopped", "stopped_by", "stops_as_ctrl_c"]

_STOPPING = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stops_as_ctrl_c() -> Iterator[None]:
    """In the block, SIGTERM and SIGHUP raise :class:`Stopped` (unless ignored already); their handlers are
    put back after. Outside the main thread, where Python runs no handler, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.getsignal(signum) for signum in _STOPPING}
    before = {signum: h for signum, h in before.items() if h is not None and h is not signal.SIG_IGN}
    for signum in before:  # one set outside Python (None) is left as it is, as is one ignored
        signal.signal(signum, _raise_stopped)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


def exit_status(stop: BaseException) -> int:
    """128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + getattr(stop, "signum", signal.SIGINT)


def stopped_by(stop: BaseException) -> str:
    """How a message names the stop: "interrupted" (Ctrl-C) or "stopped by SIGTERM"."""
    signum = getattr(stop, "signum", None)
    return "interrupted" if signum is None else f"stopped by {signal.Signals(signum).name}"


def say_stopped(command: str, stop: BaseException, writing: bool) -> int:
    """Say on stderr that ``command`` was stopped, and whether what was measured so far is being written; the
    exit status to end with."""
    done = "; writing what was measured so far" if writing else ""
    print(f"stallbench {command}: {stopped_by(stop)}{done}", file=sys.stderr)
    return exit_status(stop)
