"""A child process in a session of its own, killed whole with everything it started, Ctrl-C or not."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["session"]


@contextlib.contextmanager
def session(argv: Sequence[str], **options: Any) -> Iterator[subprocess.Popen]:
    """``argv`` started in a session of its own, which is killed whole (the process and all it started)
    when the block ends, however it ends. Ctrl-C is held back while the process starts: landing between its
    start and this block, it would leave the process running, unkilled."""
    held = _hold_sigint()
    try:
        proc = subprocess.Popen(list(argv), start_new_session=True, **options)
    except BaseException:
        _release_sigint(held)
        raise
    with proc:
        try:
            _release_sigint(held)  # a Ctrl-C held back is raised here, where the kill below is armed
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()  # killed: at once


def _hold_sigint() -> tuple[Any, list[int]] | None:
    """Ctrl-C noted, not raised, until ``_release_sigint`` (Python runs handlers in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    noted: list[int] = []
    return signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum)), noted


def _release_sigint(held: tuple[Any, list[int]] | None) -> None:
    """Put the Ctrl-C handler back, and act on a Ctrl-C noted meanwhile as it would have."""
    if held is None:
        return
    handler, noted = held
    signal.signal(signal.SIGINT, handler)
    if noted and callable(handler):
        handler(signal.SIGINT, None)
    elif noted and handler == signal.SIG_DFL:
        raise KeyboardInterrupt
