"""A DataLoader worker that outlives its parent ends on its own: the job's output pipes and shared memory it
inherited are not held by a process nobody waits for."""

from __future__ import annotations

import os
import threading
import time

__all__ = ["ORPHAN_GRACE", "guard_orphan"]

ORPHAN_GRACE = 10.0  # seconds a worker whose parent died has to leave on its own (torch's loop: 5 s)


def guard_orphan(grace: float = ORPHAN_GRACE) -> None:
    """End this worker ``grace`` seconds after its parent is gone, whatever it is doing then.

    Torch's worker loop sees a dead parent within 5 s and returns, but Python then joins the result queue's
    feeder thread, which waits for ever on a pipe nobody reads once it is full (a stamp adds up to 10 kB to
    each batch sent): the worker would linger, holding what it inherited (the job's output pipes, shared
    memory). A daemon thread checks the parent every second."""

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        time.sleep(grace)
        os._exit(1)

    threading.Thread(target=watch, name="loader-orphan-guard", daemon=True).start()
