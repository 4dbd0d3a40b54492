"""Counters and stage timings that every worker reports into, summed by the loader's ``stats()``.

Each process that loads data (the main process and each worker) owns one row of a shared array, so
reporting is a plain add into memory, with no lock and no message.
"""

from __future__ import annotations

import dataclasses
import os
from multiprocessing.sharedctypes import RawArray

import numpy as np
import torch.utils.data

from loader.cache import CacheInfo

__all__ = ["LoaderStats", "StatsBoard"]

FIELDS = (
    "hits",
    "misses",
    "bytes_from_cache",
    "bytes_from_source",
    "bytes_from_storage",
    "records_admitted",
    "records_skipped",
    "fetch_seconds",
    "decode_seconds",
    "collate_seconds",
    "batches_collated",
    "samples",
)
_COLUMN = {name: i for i, name in enumerate(FIELDS)}
_COUNTS = {f for f in FIELDS if not f.endswith("_seconds")}


@dataclasses.dataclass(frozen=True)
class LoaderStats:
    """Totals over all workers and all epochs of one DataLoader.

    ``bytes_from_storage`` is what the kernel counted as read from the storage device by the loader's
    processes (``/proc/<pid>/io`` ``read_bytes``); ``bytes_from_source`` is what the sources returned, which
    includes reads served by the OS page cache. ``records_admitted`` counts admissions by this loader;
    ``records_cached`` is what the shared cache holds, from any job.
    """

    hits: int = 0
    misses: int = 0
    bytes_from_cache: int = 0
    bytes_from_source: int = 0
    bytes_from_storage: int = 0
    records_admitted: int = 0
    records_skipped: int = 0
    fetch_seconds: float = 0.0
    decode_seconds: float = 0.0
    collate_seconds: float = 0.0
    batches_collated: int = 0
    samples: int = 0
    records_cached: int = 0
    cache_bytes_used: int = 0
    cache_capacity: int = 0

    @property
    def hit_rate(self) -> float:
        reads = self.hits + self.misses
        return self.hits / reads if reads else 0.0


class StatsBoard:
    """One row of counters per loading process, in memory shared with the workers."""

    def __init__(self, num_workers: int) -> None:
        self._rows = num_workers + 1
        self._shared = RawArray("d", self._rows * len(FIELDS))
        self._io_seen: tuple[int, int] | None = None  # (pid, read_bytes) last reported by this process

    def add(self, field: str, amount: float) -> None:
        self._row()[_COLUMN[field]] += amount

    def add_storage_reads(self) -> None:
        """Report the storage bytes this process read since it last reported (cheap: one small read)."""
        pid, now = os.getpid(), _read_bytes_of_self()
        # a worker's kernel counters start at zero; the main process marks its start (start_storage_count)
        before = self._io_seen[1] if self._io_seen is not None and self._io_seen[0] == pid else 0
        self.add("bytes_from_storage", now - before)
        self._io_seen = (pid, now)

    def start_storage_count(self) -> None:
        """Count storage reads of the calling (main) process from now on."""
        self._io_seen = (os.getpid(), _read_bytes_of_self())

    def totals(self, cache: CacheInfo | None) -> LoaderStats:
        sums = self._table().sum(axis=0)
        values = {f: (int(sums[i]) if f in _COUNTS else float(sums[i])) for f, i in _COLUMN.items()}
        if cache is not None:
            values.update(
                records_cached=cache.records_cached,
                cache_bytes_used=cache.bytes_used,
                cache_capacity=cache.capacity,
            )
        return LoaderStats(**values)

    def __getstate__(self) -> dict:
        return {"_rows": self._rows, "_shared": self._shared, "_io_seen": None}

    def _table(self) -> np.ndarray:
        table = self.__dict__.get("_view")
        if table is None:
            table = np.frombuffer(self._shared, dtype=np.float64).reshape(self._rows, len(FIELDS))
            self._view = table
        return table

    def _row(self) -> np.ndarray:
        info = torch.utils.data.get_worker_info()
        return self._table()[0 if info is None else 1 + info.id % (self._rows - 1)]


def _read_bytes_of_self() -> int:
    with open("/proc/self/io", "rb") as f:
        for line in f:
            if line.startswith(b"read_bytes:"):
                return int(line.split()[1])
    return 0
