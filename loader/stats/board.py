"""Counters and stage timings that every worker reports into, summed by the loader's ``stats()``.

Each process that loads data (the main process and each worker) owns one row of a shared array, so
reporting is a plain add into memory, with no lock and no message.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from multiprocessing.sharedctypes import RawArray
from typing import Any

import numpy as np
import torch.utils.data

from loader.cache import CacheInfo
from loader.stats.loader_stats import LoaderStats
from loader.system.counters import own_read_bytes
from loader.system.memory import format_bytes

__all__ = ["FIELDS", "StatsBoard"]

FIELDS = (
    "hits",
    "misses",
    "bytes_from_cache",
    "bytes_from_source",
    "bytes_from_storage",
    "bytes_from_peers",
    "peer_hits",
    "records_admitted",
    "files_passed",
    "records_skipped",
    "records_corrupt",
    "memory_pauses",
    "fetch_seconds",
    "miss_seconds",
    "decode_seconds",
    "collate_seconds",
    "batches_collated",
    "samples",
    "samples_from_prepared",
    "samples_prepared",
    "samples_whole",
)
_COLUMN = {name: i for i, name in enumerate(FIELDS)}
_COUNTS = {f for f in FIELDS if not f.endswith("_seconds")}
_STORAGE = _COLUMN["bytes_from_storage"]
_pid = os.getpid()  # this process's pid, kept current across forks: no getpid() call per sample


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def _given_back(cache: CacheInfo) -> str:
    own, limit = map(format_bytes, cache.given_back_at)
    return (
        f"gave back {format_bytes(cache.bytes_given_back)} ({cache.records_given_back} records) when the "
        f"job's own memory reached {own} of its {limit} limit"
    )


class StatsBoard:
    """One row of counters per loading process, in memory shared with the workers.

    ``add`` goes to a plain list private to the calling process (tens of nanoseconds); ``flush`` moves it
    into the process's shared row once per batch, together with the storage bytes the kernel counted.
    """

    def __init__(self, num_workers: int) -> None:
        self._rows = num_workers + 1
        self._shared = RawArray("d", self._rows * len(FIELDS))
        self._local_pid = -1

    def add(self, field: str, amount: float) -> None:
        if self._local_pid != _pid:
            self._start_local()
        self._pending[_COLUMN[field]] += amount

    def flush(self, storage: bool = True) -> None:
        """Publish this process's pending counts and (``storage``) its storage reads since the last flush."""
        if self._local_pid != _pid:
            self._start_local()
        if storage:
            now = own_read_bytes()
            self._pending[_STORAGE] += now - self._io_seen
            self._io_seen = now
        self._row()[:] += self._pending
        self._pending = [0.0] * len(FIELDS)

    def ensure_workers(self, num_workers: int) -> None:
        """A row for each of ``num_workers`` workers: torch lets a loader's ``num_workers`` be set after it
        is made, and two workers sharing a row would lose counts. Call before the workers start; the counts
        so far move to the main process's row."""
        rows = num_workers + 1
        if rows <= self._rows:
            return
        old = np.frombuffer(self._shared, dtype=np.float64).reshape(self._rows, len(FIELDS))
        shared = RawArray("d", rows * len(FIELDS))
        new = np.frombuffer(shared, dtype=np.float64).reshape(rows, len(FIELDS))
        new[0] = old.sum(axis=0)
        self._shared, self._rows = shared, rows
        if self._local_pid == os.getpid():
            self._view = new

    def count(self, *fields: str) -> float:
        """The sum of ``fields`` over every process's row, as published so far (each worker's last flush)."""
        table = self._table()
        return float(sum(table[:, _COLUMN[field]].sum() for field in fields))

    def start_storage_count(self) -> None:
        """Count storage reads of the calling (main) process from now on, not since it started."""
        self._start_local()
        self._io_seen = own_read_bytes()

    def totals(
        self, caches: Iterable[CacheInfo] = (), cache_sizing: str = "", form: Any = None
    ) -> LoaderStats:
        """The sums over every process's row, with what the ``caches`` (the loader's stores) hold now."""
        if self._local_pid == os.getpid():
            self.flush(storage=self._rows == 1)  # the main process loads data only without workers
        sums = self._table().sum(axis=0)
        values = {f: (int(sums[i]) if f in _COUNTS else float(sums[i])) for f, i in _COLUMN.items()}
        caches = list(caches)
        values.update(
            records_cached=sum(c.records_cached for c in caches),
            cache_bytes_used=sum(c.bytes_used for c in caches),
            cache_capacity=sum(c.capacity for c in caches),
            cache_bytes_given_back=sum(c.bytes_given_back for c in caches),
        )
        if form is not None:
            values.update(cache_form=form.form, cache_form_reason=form.reason, cache_form_epochs=form.epochs)
        said = [cache_sizing] if cache_sizing else []
        if values["memory_pauses"] and values["cache_bytes_used"] < values["cache_capacity"]:
            said.append(
                f"memory ran short: it holds {format_bytes(values['cache_bytes_used'])} (admission paused)"
            )
        said += [_given_back(c) for c in caches if c.bytes_given_back]
        return LoaderStats(**values, cache_sizing="; ".join(said))

    def __getstate__(self) -> dict:
        return {"_rows": self._rows, "_shared": self._shared, "_local_pid": -1}

    def _start_local(self) -> None:
        """First use in a process. A worker's kernel I/O counters start at zero when it is made; the main
        process counts from here (and from each epoch's start, see ``start_storage_count``)."""
        self._local_pid = os.getpid()
        self._pending = [0.0] * len(FIELDS)
        self._io_seen = 0 if torch.utils.data.get_worker_info() is not None else own_read_bytes()
        self._view = np.frombuffer(self._shared, dtype=np.float64).reshape(self._rows, len(FIELDS))

    def _table(self) -> np.ndarray:
        if self._local_pid != os.getpid():
            self._start_local()
        return self._view

    def _row(self) -> np.ndarray:
        info = torch.utils.data.get_worker_info()
        return self._table()[0 if info is None else 1 + info.id % (self._rows - 1)]
