"""What forking workers costs the job in memory, measured on this process and its children: what the family's
anonymous memory grew by between one fork of workers and the next (or their shutdown), per worker. A loader
makes room in its store for that much per worker before it starts workers (``cache._attached``): the growth
comes within milliseconds of the fork, faster than any look at the memory, and the generic reserve
(``headroom.reserve_for_limit``, a fifth of the job) can be less than it.

Counted: the pages each worker copies on write (its own writes, and the ones this process writes after the
fork, which leave the original with the worker), each worker's allocations, and this process's own growth
while the workers run (its first steps' buffers, an optimizer's state): the job grows by all of it after a
fork. Measured on the digits job of ``bench_tight_budget`` (~290 MiB, two persistent workers per loader, its
memory sampled every 10 ms): the estimate at its evaluation loader's fork was 58-64 MiB and the job then grew
by 64-67 MiB; counting only what the workers hold alone said 40 MiB.

Read from ``/proc/<pid>/smaps_rollup`` (~3.5 ms for a process that imported torch): a page of anonymous
memory is split among the processes that map it (``Pss_Anon``), so the family's ``Pss_Anon`` sums to its
anonymous memory, each page once. The store's pages are shared memory, not anonymous: not counted. The most
measured per worker stands for the process's next workers (a loader without persistent workers forks anew
each epoch, after the last epoch's workers and their memory have gone: a reading then says nothing of them);
before any (a process's first workers), nothing: the reserve alone.

The readings cost: a loader without persistent workers forks and shuts them down each epoch, and a job
with an evaluation loader twice, ~17 ms each with the family's five readings. In a Lightning job of 0.13 s
epochs (360 images, 2 workers, a validation each epoch) that made ours 25-35% slower than torch's loader. So
the readings of a fork, and of its workers' shutdown, take at most ``BUDGET`` of the process's time: a fork
that comes sooner after the last measured one is not measured, and the most measured before stands for it.
A process's first fork is always measured, and so is one made while the growth of a measured fork is still
to be read (a persistent loader's workers running when an evaluation loader forks): its reading is that one's
too.
"""

from __future__ import annotations

import multiprocessing
import os
import time

__all__ = ["family_anon", "growth_for", "measure_growth"]

BUDGET = 0.01  # the share of the process's time the readings may take
_most_per_worker = 0  # bytes: the most the family grew after this process forked workers, per worker
_last_fork: tuple[int, int] | None = None  # the family's anonymous memory then (bytes), the workers forked
_next_reading = 0.0  # time.monotonic(): a fork before then is not measured


def _pss_anon(pid: int) -> int:
    """The process's share of each anonymous page it maps (bytes); 0 where it has exited (or its files
    cannot be read)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                name, _, rest = line.partition(":")
                if name == "Pss_Anon":
                    return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def family_anon() -> int:
    """The anonymous memory of this process and its running children, each page once (bytes)."""
    family = [os.getpid(), *(child.pid for child in multiprocessing.active_children())]
    return sum(_pss_anon(pid) for pid in family)


def measure_growth(now: int | None = None) -> int:
    """What the family grew by since this process last forked workers, where that fork was measured (its
    anonymous memory ``now``, read where not given), per worker of that fork, noted where more than any
    measure before; the most noted (bytes; 0 before a fork)."""
    global _most_per_worker, _last_fork
    if _last_fork is not None:
        anon_then, workers = _last_fork
        now = _read() if now is None else now
        _most_per_worker = max(_most_per_worker, (now - anon_then) // workers)
        _last_fork = None  # read: a reading after its workers have gone would say nothing of them
    return _most_per_worker


def growth_for(workers: int) -> int:
    """The memory ``workers`` workers about to fork are expected to take (bytes), as this process's earlier
    workers did; they are noted as the last fork (the family read once for both), where a reading is due
    (``BUDGET``)."""
    global _last_fork
    if _last_fork is None and time.monotonic() < _next_reading:
        return workers * _most_per_worker  # not measured: the most measured before stands for it
    now = _read()
    growth = workers * measure_growth(now)
    _last_fork = (now, workers) if workers else None
    return growth


def _read() -> int:
    """``family_anon()``, its cost counted against ``BUDGET``."""
    global _next_reading
    start = time.monotonic()
    now = family_anon()
    spent = time.monotonic() - start
    _next_reading = max(_next_reading, start) + spent / BUDGET
    return now
