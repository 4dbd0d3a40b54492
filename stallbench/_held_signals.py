"""Ctrl-C, SIGTERM and SIGHUP held back over a step that must not be cut in two (a process started and not yet
armed to be killed, a cgroup made and not yet noted for removal), then acted on as their handlers would have.

Python runs signal handlers in the main thread only, between bytecodes: each of these signals raises
``KeyboardInterrupt`` there (``stallbench.cli.stops``), so one landing between a thing's making and its noting
leaves the thing behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Held", "hold_signals", "release_signals", "signals_held"]

_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each ends stallbench (``stallbench.cli.stops``)

Held = tuple[dict[int, Any], list[int]] | None


def hold_signals() -> Held:
    """Ctrl-C, SIGTERM and SIGHUP noted, not acted on, until ``release_signals`` (outside the main thread,
    where Python runs no handler, nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    noted: list[int] = []
    handlers = {signum: signal.getsignal(signum) for signum in _HELD}
    handlers = {signum: h for signum, h in handlers.items() if h is not None}  # one set outside Python: as is
    for signum in handlers:
        signal.signal(signum, lambda signum, frame: noted.append(signum))
    return handlers, noted


def release_signals(held: Held) -> None:
    """Put the handlers back, and act on a signal noted meanwhile as they would have."""
    if held is None:
        return
    handlers, noted = held
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    for signum in dict.fromkeys(noted):
        handler = handlers[signum]
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL and signum == signal.SIGINT:
            raise KeyboardInterrupt
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), signum)  # its default: the process ends


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """The block runs whole; a stop that came meanwhile acts as it ends (after an error of the block's own,
    the stop is what propagates)."""
    held = hold_signals()
    try:
        yield
    finally:
        release_signals(held)
