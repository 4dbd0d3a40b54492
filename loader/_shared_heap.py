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
skip) for the moment its workers fork, and unfreezes it in its own process right after: the workers
inherit the frozen set and never examine those objects; the loader's process collects them as before.
CPython's documentation gives this recipe for processes that fork without exec. Tried and undone: keeping
the heap frozen while the workers run, so that the loader's process's own collections do not copy the
pages it shares with them either (the digits job's peak 337-340 MiB against 347-352): the loader's own
objects were then frozen too, and a loader with persistent workers dropped in a reference cycle was never
collected, its workers living on, where torch's is collected (``test_shared_heap.py``). A process that
froze its heap itself is left as it is. Spawned and forkserver workers start from a fresh interpreter:
nothing changes for them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["heap_frozen_for_fork"]


@contextlib.contextmanager
def heap_frozen_for_fork() -> Iterator[None]:
    """Freeze this process's objects out of collection for the block (workers forked in it inherit that),
    then unfreeze them here; a no-op where the process froze some itself or collects nothing."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
