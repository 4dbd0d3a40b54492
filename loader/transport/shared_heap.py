"""Forked workers keep sharing the loader's process memory and pin none of its free memory: its objects are
frozen out of the workers' garbage collection, and its C heap is trimmed just before they fork.

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

A fork also shares the C heap's free memory: glibc keeps what a training step freed (its activations, its
gradients) for the next step, returning only the top of a heap past a threshold. A worker forked then maps
those free pages too, and when the parent reuses them, it copies each one, the worker keeping the original:
the fork pins the step's free memory for the worker's life. So the loader trims the heap
(``system.libc.trim_heap``, ~3 ms) just before its workers fork. Measured on the digits job under a
385 MiB limit (its memory sampled every 10 ms, ``smaps_rollup`` every 100 ms): its evaluation loader's two
workers forked from a process that held 15 MiB of such free memory, and took 67 and 71 MiB of the job's
anonymous memory (torch's loader's, forked a moment where less was held: 62 MiB each); with the heap
trimmed, 59 MiB each, and the job's later epochs read 12-17 MB each from storage where they had read 33-39.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from loader.system.libc import trim_heap

__all__ = ["heap_ready_for_fork"]


@contextlib.contextmanager
def heap_ready_for_fork() -> Iterator[None]:
    """Trim the C heap, and freeze this process's objects out of collection for the block (workers forked
    in it inherit that), then unfreeze them here; the freezing left out where the process froze some itself
    or collects nothing."""
    trim_heap()
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
