"""Read-ahead inside a worker, only where it pays: a batch's records fetched on threads while others decode.

Storage reads release the GIL, so with records on storage a worker no longer sits idle on I/O between two
decodes. With records in memory (our cache, the page cache) a fetch is a ~10 us copy: there is nothing to
hide, and the threads only cost (measured: ~100 us per 500x375 JPEG, 8% of its decode). So each worker decides
from what it measures: it fetches a batch's first records one by one (until ``PROBE_MISSES`` of them missed
our cache: a whole batch one by one is 64 round trips in a row, 3.5 s with 50 ms to object storage) and times
them, turns read-ahead on, for the rest of that batch already, when a record's fetch costs more than a memory
copy would (``MIN_FETCH_S`` plus its bytes at ``COPY_BPS``: a 112 KB record from memory takes ~57 us on a slow
VM) and at least ``ON_RATIO`` of its decode. It turns it off again as soon as a batch read ahead came wholly
from our cache (a memory copy, whatever the threads measured), and re-measures so every ``PROBE_EVERY``
batches, turning it off below ``OFF_RATIO``. A batch whose misses all came from the page cache at memory speed
turns it off too.

Slow fetches do not mean threads help: storage capped in bytes per second (a throttled cgroup, a saturated
disk) is as slow with 4 reads in flight as with one. So each batch measured one by one also weighs what the
threads bought: when the records read ahead since the last one took more than ``PAYS_BELOW`` of its time per
record, read-ahead goes off for ``HOLD_OFF`` batches. (Measured, 200 MB/s cap, 2 workers: the threads left
epoch 1 no faster and the warm epochs after it 3-10% slower than with one-by-one reads.)

How many fetches run at once comes from the same measure: a fetch that waits ``f`` (a network round trip to
object storage, a disk seek) while a record decodes in ``d`` is hidden by ``ceil(f / d) + 1`` fetches in
flight, so that is the window (``in_flight``), between 2 and the threads given: enough to keep the decode
busy, no more requests than that.
"""

from __future__ import annotations

import collections
import functools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = [
    "COPY_BPS",
    "HOLD_OFF",
    "MIN_FETCH_S",
    "OFF_RATIO",
    "ON_RATIO",
    "PAYS_BELOW",
    "PROBE_EVERY",
    "PROBE_MISSES",
    "SLOWER_THAN_COPY",
    "ReadAhead",
]

MIN_FETCH_S = 50e-6  # a fetch faster than this, plus its bytes at COPY_BPS, is a memory copy
COPY_BPS = 1e9  # bytes per second a memory copy reaches at the least (measured 2-3 GB/s on a 2-core VM)
# A fetch must take this many times a copy's time to count as storage where one noisy figure would switch the
# threads on (a one-by-one batch preempted for a few ms) or keep them on (reads on threads wait for the GIL):
# 112 KB from the page cache measured 137-248 us on threads, the same from storage at 200 MB/s 560 us or more.
SLOWER_THAN_COPY = 2.0
ON_RATIO, OFF_RATIO = 0.10, 0.05  # fetch time per record, as a fraction of its decode time
PROBE_EVERY = 16  # while on, one batch in this many is measured one by one (its first records) again
PROBE_MISSES = 4  # a batch measured one by one: its first records, until this many missed our cache
PAYS_BELOW = 0.9  # records read ahead must take at most this share of one-by-one records' time each
HOLD_OFF = 4 * PROBE_EVERY  # batches read-ahead stays off after it did not pay


class ReadAhead:
    """A thread pool per process (made lazily: each forked or spawned worker has its own) and its switch."""

    def __init__(self, threads: int) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"readahead must be a positive number of threads, got {threads!r}")
        self.threads = threads
        self.in_flight = threads  # fetches running at once: from the fetch and decode times measured
        self.active = False
        self._batches = 0
        self._held = 0  # batches left to stay off because read-ahead did not pay
        self._ahead = [0.0, 0]  # seconds and records of the batches read ahead since the last one by one
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1

    def wanted(self) -> bool:
        """Whether the next batch should be read ahead (False: fetch its first records one by one and
        ``observe`` them)."""
        self._batches += 1
        self._held = max(0, self._held - 1)
        return self.active and self._batches % PROBE_EVERY != 0

    def observe(
        self, fetch_seconds: float, decode_seconds: float, records: int, nbytes: int = 0, seconds: float = 0.0
    ) -> None:
        """``records`` of a batch (``nbytes`` in all) fetched one by one, which took ``seconds`` in all:
        switch read-ahead on or off from their fetch and decode times and what the threads bought."""
        if records == 0:
            return
        if not self._paid(seconds / records) and self.active:
            self.active, self._held = False, HOLD_OFF
        if self._held:
            return
        fetch, decode = fetch_seconds / records, decode_seconds / records
        hidden = math.ceil(fetch / decode) + 1 if decode > 0 else self.threads
        self.in_flight = max(min(2, self.threads), min(self.threads, hidden))
        ratio = OFF_RATIO if self.active else ON_RATIO
        copy = (MIN_FETCH_S + nbytes / records / COPY_BPS) * (1.0 if self.active else SLOWER_THAN_COPY)
        self.active = fetch >= copy and fetch >= ratio * decode

    def read_ahead(
        self, records: int, seconds: float, misses: int, miss_seconds: float = 0.0, miss_bytes: int = 0
    ) -> None:
        """A batch of ``records`` read ahead in ``seconds``, whose ``misses`` records missing our cache took
        ``miss_seconds`` to fetch (``miss_bytes`` in all): off when none missed, or the misses came as fast
        as memory copies (the page cache holds them), so there was nothing to hide."""
        self._ahead[0] += seconds
        self._ahead[1] += records
        copy = MIN_FETCH_S + miss_bytes / misses / COPY_BPS if misses else 0.0
        if misses == 0 or miss_seconds / misses < SLOWER_THAN_COPY * copy:
            self.active = False

    def _paid(self, one_by_one: float) -> bool:
        """Whether the batches read ahead since the last one-by-one batch took at most ``PAYS_BELOW`` of
        its time per record (``one_by_one``); resets the sums, so each period read ahead is judged alone."""
        (seconds, records), self._ahead = self._ahead, [0.0, 0]
        return records == 0 or seconds / records <= PAYS_BELOW * one_by_one

    def fetched(self, fetch: Callable[[int], Any], indices: Sequence[int]) -> Iterator[Callable[[], Any]]:
        """For each index in order, the result of ``fetch(i)`` to wait for: at most ``in_flight`` fetches run
        at once, the next one starting as each result is taken."""
        if self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="stallbench-readahead")
            self._pid = os.getpid()
        waiting, window = iter(indices), collections.deque()

        def top_up() -> None:
            while len(window) < self.in_flight and (index := next(waiting, None)) is not None:
                window.append(self._pool.submit(fetch, index))

        def taken(future: Future) -> Any:
            try:
                return future.result()
            finally:
                top_up()

        top_up()
        while window:
            yield functools.partial(taken, window.popleft())
            top_up()  # where the result was not taken

    def __getstate__(self) -> dict:
        fresh = {"active": False, "_batches": 0, "_held": 0, "_ahead": [0.0, 0], "_pool": None, "_pid": -1}
        fresh["in_flight"] = self.threads
        return {"threads": self.threads, **fresh}
