"""The stores attached in this process, so that a loader can make room in them before its workers start.

Starting workers grows the job at once, faster than any look at the memory: forked workers copy their
parent's pages as they first write to them, spawned ones load an interpreter each (``headroom``'s reserve
is for that growth). The store admits only while the reserve is free, but the job may have grown into it
since (an earlier loader's workers, a bigger heap), and a store that then meets the new workers' growth
with less than the reserve free can have the job killed before any look sees it. So our loader asks every
store attached in its process to give back what keeps the reserve free, or room for the growth measured of
this process's earlier workers (``system.forkgrowth``) where that is more, just before it starts workers
(``MinIOCache.make_room``). (Sampled every 10 ms on the digits job of ``bench_tight_budget``: its
evaluation loader's two workers grew it by ~12 MiB within 10 ms of their fork.)"""

from __future__ import annotations

import weakref
from typing import Any

from loader.system.forkgrowth import growth_for

__all__ = ["make_room_for_workers", "note_attached"]

_stores: weakref.WeakSet[Any] = weakref.WeakSet()


def note_attached(store: Any) -> None:
    """``store`` (a ``MinIOCache``) is attached in this process until it is closed or collected."""
    _stores.add(store)


def make_room_for_workers(workers: int) -> int:
    """Each store attached in this process gives back what keeps the memory reserve, or room for ``workers``
    more workers, from being free now; the bytes given back in all."""
    growth = growth_for(workers)  # noted even where no store is attached yet: one may be by the next fork
    return sum(store.make_room(growth) for store in list(_stores))
