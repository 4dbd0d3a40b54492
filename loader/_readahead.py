"""Read-ahead inside a worker, only where it pays: a batch's records fetched on threads while others decode.

Storage reads release the GIL, so with records on storage a worker no longer sits idle on I/O between two
decodes. With records in memory (our cache, the page cache) a fetch is a ~10 us copy: there is nothing to
hide, and the threads only cost (measured: ~100 us per 500x375 JPEG, 8% of its decode). So each worker
decides from what it measures: it fetches one by one and times it, turns read-ahead on when a record's fetch
costs more than a memory copy would (``MIN_FETCH_S`` plus its bytes at ``COPY_BPS``: a 112 KB record from
memory takes ~57 us on a slow VM) and at least ``ON_RATIO`` of its decode. It turns it off again as soon as
a batch read ahead came wholly from our cache (a memory copy, whatever the threads measured), and re-measures
one by one every ``PROBE_EVERY`` batches, turning it off below ``OFF_RATIO``. A batch whose misses all came
from the page cache at memory speed turns it off too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["COPY_BPS", "MIN_FETCH_S", "OFF_RATIO", "ON_RATIO", "PROBE_EVERY", "SLOWER_THAN_COPY", "ReadAhead"]

MIN_FETCH_S = 50e-6  # a fetch faster than this, plus its bytes at COPY_BPS, is a memory copy
COPY_BPS = 1e9  # bytes per second a memory copy reaches at the least (measured 2-3 GB/s on a 2-core VM)
# A fetch must take this many times a copy's time to count as storage where one noisy figure would switch the
# threads on (a one-by-one batch preempted for a few ms) or keep them on (reads on threads wait for the GIL):
# 112 KB from the page cache measured 137-248 us on threads, the same from storage at 200 MB/s 560 us or more.
SLOWER_THAN_COPY = 2.0
ON_RATIO, OFF_RATIO = 0.10, 0.05  # fetch time per record, as a fraction of its decode time
PROBE_EVERY = 16  # while on, one batch in this many is fetched one by one to measure the fetch again


class ReadAhead:
    """A thread pool per process (made lazily: each forked or spawned worker has its own) and its switch."""

    def __init__(self, threads: int) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"readahead must be a positive number of threads, got {threads!r}")
        self.threads = threads
        self.active = False
        self._batches = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1

    def wanted(self) -> bool:
        """Whether the next batch should be read ahead (False: fetch one by one and ``observe`` it)."""
        self._batches += 1
        return self.active and self._batches % PROBE_EVERY != 0

    def observe(self, fetch_seconds: float, decode_seconds: float, records: int, nbytes: int = 0) -> None:
        """A batch of ``records`` (``nbytes`` in all) fetched one by one: switch read-ahead on or off from
        its fetch and decode times."""
        if records == 0:
            return
        fetch, decode = fetch_seconds / records, decode_seconds / records
        ratio = OFF_RATIO if self.active else ON_RATIO
        copy = (MIN_FETCH_S + nbytes / records / COPY_BPS) * (1.0 if self.active else SLOWER_THAN_COPY)
        self.active = fetch >= copy and fetch >= ratio * decode

    def saw_misses(self, misses: int, seconds: float = 0.0, nbytes: int = 0) -> None:
        """A batch read ahead, whose ``misses`` records missing our cache took ``seconds`` to fetch
        (``nbytes`` in all): off when none missed, or the misses came as fast as memory copies (the page
        cache holds them), so there was nothing to hide."""
        copy = MIN_FETCH_S + nbytes / misses / COPY_BPS if misses else 0.0
        if misses == 0 or seconds / misses < SLOWER_THAN_COPY * copy:
            self.active = False

    def submit_all(self, fetch: Callable[[int], Any], indices: Sequence[int]) -> list[Future]:
        """Start ``fetch(i)`` for every index; the futures come back in the same order."""
        if self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="stallbench-readahead")
            self._pid = os.getpid()
        return [self._pool.submit(fetch, i) for i in indices]

    def __getstate__(self) -> dict:
        return {"threads": self.threads, "active": False, "_batches": 0, "_pool": None, "_pid": -1}
