"""Forked workers keep sharing the loader's process memory: its objects are frozen out of the workers'
garbage collection.

A forked worker shares its parent's pages until it writes to one. CPython's cycle collector writes to every
object it examines (its ``gc_refs``), so each full collection in a worker copies every page of the parent
that holds a tracked object: the job's Python heap (torch's, the model's, the Dataset's) is copied into each
worker, bit by bit, as its collections run. Measured on the digits job of ``bench_tight_budget`` (two
persistent workers of a loader serving the Dataset's own reads, which allocate more, so collect more):
each train worker's private anonymous memory grew by ~9 MiB more than under torch's loader; with the
objects frozen, by ~2 MiB, and the job's memory peak (its cgroup's ``rss``) fell by about as much. That
memory is the page cache a tight budget lacks.

So the loader freezes the heap (``gc.freeze``: every object moves to a permanent generation collections
skip) as its workers fork, and keeps it frozen while they run: the workers inherit the frozen set and never
examine those objects, and neither does the loader's process, whose collections would copy each page it
shares with them just the same (a write on either side of a fork copies the page). Measured on the same
job, unfreezing right after the fork left the job's memory peak 10-12 MiB higher (347-352 MiB against
337-340, two runs each). Once the last workers forked with it frozen are gone, the heap is unfrozen: a
cycle among objects made before the fork that became garbage while they ran is collected then, not
before. CPython's documentation gives this recipe for processes that fork without exec. A process that
froze its heap itself is left as it is. Spawned and forkserver workers start from a fresh interpreter:
nothing changes for them.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator

__all__ = ["heap_frozen_for_fork"]

_forked_frozen = 0  # worker sets forked with the heap frozen by us that have not ended
_lock = threading.Lock()


@contextlib.contextmanager
def heap_frozen_for_fork() -> Iterator[Callable[[], None]]:
    """Freeze this process's objects out of collection for workers forked in the block (they inherit it);
    gives the function to call once, when those workers are gone: the heap is unfrozen when no workers
    forked frozen remain. A no-op where the process froze some itself or collects nothing."""
    global _forked_frozen
    with _lock:
        ours = gc.isenabled() and (_forked_frozen or not gc.get_freeze_count())
        if ours:
            gc.freeze()
            _forked_frozen += 1
    if not ours:
        yield lambda: None
        return
    released = False

    def release() -> None:
        global _forked_frozen
        nonlocal released
        with _lock:
            if not released:
                released, _forked_frozen = True, _forked_frozen - 1
                if not _forked_frozen:
                    gc.unfreeze()

    try:
        yield release
    except BaseException:
        release()
        raise
