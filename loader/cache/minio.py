"""The node-local minimal-miss (MinIO) store: admit records until full, never evict.

Every epoch of a random-order job touches every record once, so the records to keep are any ``capacity``
of them, kept forever: each later epoch then hits exactly ``capacity / dataset`` of its reads, which is the
best any policy can do (see docs/concepts/minio-cache.md). One store per dataset fingerprint lives in this
user's private folder of ``cache_dir`` (``/dev/shm`` by default), shared by every worker and every job of the
user that reads the same source, and it outlives the job, so the next run starts warm. Nothing read back is
trusted: every record is bounds-checked and checksummed before it is served.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import stat
import struct
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loader._memory import PressureGauge, format_bytes, reserve_bytes
from loader.cache._layout import (
    EMPTY,
    HEADER_BYTES,
    HEADER_DTYPE,
    MAGIC,
    READY,
    RESERVED,
    SLOT_DTYPE,
    VERSION,
    checksum,
    index_bytes,
)
from loader.cache._locks import LockTimeout, StoreMutex, forget_writer, writer_alive, writer_id
from loader.cache._private import check_private, open_private, private_dir
from loader.cache._storefiles import create_store

__all__ = ["LOCK_TIMEOUT", "CacheInfo", "CorruptRecordError", "MinIOCache", "store_path"]

_SLOT_HEAD = struct.Struct("<QIIQ")  # offset, length, state, checksum: the head of a slot, read in one call
_SLOT_SIZE = SLOT_DTYPE.itemsize
LOCK_TIMEOUT = 5.0  # seconds a writer waits for the store's lock before it reads on without admitting
_ADMIT_PAUSE = 30.0  # after such a timeout, this process admits nothing for this long
_MEMORY_PAUSE = 5.0  # when memory is short, this process admits nothing for this long, then looks again


class CorruptRecordError(ValueError):
    """A cached record failed its bounds or checksum check; it is not served."""


@dataclass(frozen=True)
class CacheInfo:
    """What a store holds right now, over every process and job that shares it."""

    path: Path
    capacity: int
    bytes_used: int
    records_cached: int
    full: bool


def store_path(cache_dir: str | os.PathLike, fingerprint: str) -> Path:
    """Where the store of a source with ``fingerprint`` lives: in this user's folder of ``cache_dir``."""
    return Path(cache_dir) / f"stallbench-{os.geteuid()}" / f"minio-{fingerprint[:64]}"


class MinIOCache:
    """A fixed-capacity record store in shared memory; safe for many processes to read and fill at once."""

    def __init__(
        self, path: Path, fingerprint: str, num_records: int, lock_timeout: float = LOCK_TIMEOUT
    ) -> None:
        self.path = path
        self._fingerprint = fingerprint
        self._num_records = num_records
        self._mutex = StoreMutex(path, lock_timeout)
        self._attach()

    @classmethod
    def open(
        cls,
        *,
        fingerprint: str,
        num_records: int,
        capacity: int,
        cache_dir: str | os.PathLike = "/dev/shm",
        lock_timeout: float = LOCK_TIMEOUT,
        warn_capacity: bool = True,
    ) -> MinIOCache:
        """Attach to this source's store in ``cache_dir``, creating it with ``capacity`` bytes if absent
        (an existing store keeps its own capacity: ``warn_capacity`` warns when it differs).

        Raises UntrustedCacheError (a PermissionError) naming the path and its owner when the folder or a
        file in the way is not this user's own and private.
        """
        _check_capacity(capacity, num_records)
        if not Path(cache_dir).is_dir():
            raise ValueError(f"cache_dir {str(cache_dir)!r} is not an existing directory")
        path = store_path(cache_dir, fingerprint)
        private_dir(path.parent.parent, path.parent.name)
        try:
            store = cls._attach_or_create(path, fingerprint, num_records, capacity, lock_timeout)
        except _Damaged as exc:
            warnings.warn(f"{exc}; the cache is made anew", RuntimeWarning, stacklevel=2)
            shutil.rmtree(path, ignore_errors=True)
            store = cls._attach_or_create(path, fingerprint, num_records, capacity, lock_timeout)
        if warn_capacity and store.capacity != capacity:
            warnings.warn(
                f"the cache at {path} was made with capacity {store.capacity} bytes; using it as it is "
                f"(cache_bytes={capacity} applies only to a new cache)",
                RuntimeWarning,
                stacklevel=2,
            )
        return store

    @classmethod
    def _attach_or_create(
        cls, path: Path, fingerprint: str, num_records: int, capacity: int, lock_timeout: float
    ) -> MinIOCache:
        if not os.path.lexists(path):
            create_store(path, fingerprint=fingerprint, num_records=num_records, capacity=capacity)
        return cls(path, fingerprint, num_records, lock_timeout)

    @property
    def capacity(self) -> int:
        return int(self._header["capacity"][0])

    def get(self, index: int) -> bytes | None:
        """The cached bytes of record ``index``, or None when the store does not hold it.

        Raises CorruptRecordError when the slot points outside the data or the bytes fail their checksum.
        """
        if self._off:
            return None
        if not 0 <= index < self._num_records:
            raise IndexError(f"record index {index} out of range for a cache of {self._num_records} records")
        offset, length, state, expected = _SLOT_HEAD.unpack_from(self._map, HEADER_BYTES + _SLOT_SIZE * index)
        if state != READY:
            return None
        if offset + length > self._data_bytes:
            raise CorruptRecordError(f"slot {index} of {self.path} points past the end of its data")
        if offset + length > os.fstat(self._data_fd).st_size:  # a copy from past the end would be SIGBUS
            raise CorruptRecordError(f"record {index} in {self.path} lies past the end of its data file")
        raw = self._data[offset : offset + length]  # a copy out of the mapping: a third cheaper than pread
        if len(raw) != length or checksum(index, raw) != expected:
            raise CorruptRecordError(f"record {index} in {self.path} fails its checksum")
        return raw

    def accepting(self, index: int) -> bool:
        """Whether ``admit(index, ...)`` may store the record now: the store has room (or a dead writer's
        slot for it) and admission is not paused. Cheap: read before a miss is read from the source."""
        if self._off or time.monotonic() < self._paused_until:
            return False
        full = self._full_here or self._full[0]
        return not full or self._state[index] == RESERVED  # a dead writer's slot is reused even when full

    def admit(self, index: int, payload: bytes) -> bool:
        """Store record ``index`` if there is room and memory to spare; True when this call admitted it.

        The store's pages cannot be reclaimed by the kernel, so when the job's memory (its cgroup's, or the
        machine's) runs within a reserve of its limit, admission pauses, with one warning per process.
        """
        if not self.accepting(index):
            return False
        if self._gauge.short(len(payload)):
            self._pause_for_memory()
            return False
        try:
            offset = self._reserve(index, len(payload))
        except LockTimeout as exc:
            self._pause_admission(exc)
            return False
        except OSError as exc:  # the store was removed or replaced under us: read on from storage
            self._turn_off(exc)
            return False
        if offset is None or not self._write(payload, offset):
            return False
        self._checksum[index] = checksum(index, payload)
        self._state[index] = READY  # one aligned 4-byte store: the record becomes visible whole
        return True

    def info(self) -> CacheInfo:
        return CacheInfo(
            path=self.path,
            capacity=self.capacity,
            bytes_used=int(self._used[0]) + index_bytes(self._num_records),
            records_cached=int(np.count_nonzero(self._state == READY)),
            full=bool(self._full[0]),
        )

    def destroy(self) -> None:
        """Remove the store from ``cache_dir`` (other processes still attached keep their mapping)."""
        self.close()
        forget_writer(self.path)
        shutil.rmtree(self.path, ignore_errors=True)

    def close(self) -> None:
        if isinstance(getattr(self, "_data", None), mmap.mmap):
            self._data.close()
            self._data = b""
        if self._data_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._data_fd)
        self._data_fd = None
        self._mutex.close()

    def __getstate__(self) -> dict:
        return {
            "path": self.path,
            "fingerprint": self._fingerprint,
            "num_records": self._num_records,
            "lock_timeout": self._mutex.timeout,
        }

    def __setstate__(self, state: dict) -> None:
        """Attach in a worker; a store that cannot be attached there (removed, replaced) is turned off."""
        try:
            self.__init__(state["path"], state["fingerprint"], state["num_records"], state["lock_timeout"])
        except (OSError, ValueError) as exc:
            self.path, self._data_fd = state["path"], None
            self._mutex = StoreMutex(self.path, state["lock_timeout"])
            self._turn_off(exc)

    def _attach(self) -> None:
        check_private(os.lstat(self.path), self.path, want=stat.S_IFDIR)  # again in every process
        index_fd = open_private(self.path, "index", os.O_RDWR)
        try:
            size = os.fstat(index_fd).st_size
            if size < HEADER_BYTES:
                raise _Damaged(f"the cache index {self.path / 'index'} is truncated")
            self._map = mmap.mmap(index_fd, 0)
        finally:
            os.close(index_fd)
        self._header = np.frombuffer(self._map, HEADER_DTYPE, count=1)
        _check_header(self._header, self.path, self._fingerprint, self._num_records)
        # views of the header's fields, made once: a field lookup on each admission costs a microsecond
        self._full, self._used = self._header["full"], self._header["used"]
        self._data_capacity = int(self._header["data_capacity"][0])
        if size != index_bytes(self._num_records):
            raise _Damaged(f"the cache index {self.path / 'index'} has the wrong size")
        slots = np.frombuffer(self._map, SLOT_DTYPE, count=self._num_records, offset=HEADER_BYTES)
        self._offset, self._length, self._state = slots["offset"], slots["length"], slots["state"]
        self._checksum, self._writer, self._generation = (
            slots["checksum"],
            slots["writer"],
            slots["generation"],
        )
        self._data_fd = open_private(self.path, "data", os.O_RDWR)
        self._data_bytes = min(self._data_capacity, os.fstat(self._data_fd).st_size)
        # hits are copied out of a read-only mapping: 12 us per 112 KB record against pread's 18 us from tmpfs
        # (the kernel walks tmpfs page by page); slots are bounds-checked against _data_bytes before a copy
        self._data = (
            mmap.mmap(self._data_fd, self._data_bytes, prot=mmap.PROT_READ) if self._data_bytes else b""
        )
        self._full_here = False
        self._paused_until = 0.0
        self._off = False
        self._gauge = PressureGauge()
        self.memory_pauses = 0  # times this process paused admission because memory was short

    def _reserve(self, index: int, length: int) -> int | None:
        """Space for ``length`` bytes of record ``index``, marked as this process's; None if none is had."""
        me = writer_id(self.path)
        with self._mutex.held():
            state = self._state[index]
            if state == RESERVED and self._reclaimable(index, length):
                self._writer[index], self._generation[index] = me  # a dead writer's: space reused
                return int(self._offset[index])
            if self._full[0] or state != EMPTY:
                return None
            used = int(self._used[0])
            if used + length > self._data_capacity:
                self._full[0] = 1
                return None
            self._used[0] = used + length  # space first: a writer killed now only wastes it
            self._offset[index], self._length[index] = used, length
            self._writer[index], self._generation[index] = me
            self._state[index] = RESERVED
            return used

    def _reclaimable(self, index: int, length: int) -> bool:
        """A RESERVED slot left by a writer that died mid-insert, sized for this record."""
        fits = int(self._length[index]) == length and int(self._offset[index]) + length <= self._data_bytes
        writer = (int(self._writer[index]), int(self._generation[index]))
        return fits and not writer_alive(self.path, writer)

    def _write(self, payload: bytes, offset: int) -> bool:
        try:
            written = os.pwrite(self._data_fd, payload, offset)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            written = -1
        if written == len(payload):
            return True
        self._full_here = True
        self._full[0] = 1
        warnings.warn(
            f"no space left for the cache at {self.path}: it stops admitting records at "
            f"{int(self._used[0])} bytes; training goes on reading from storage",
            RuntimeWarning,
            stacklevel=3,
        )
        return False

    def _turn_off(self, exc: Exception) -> None:
        self._off = True
        warnings.warn(
            f"the cache at {self.path} cannot be used in this process ({exc}); it reads from storage",
            RuntimeWarning,
            stacklevel=3,
        )

    def _pause_admission(self, exc: LockTimeout) -> None:
        self._paused_until = time.monotonic() + _ADMIT_PAUSE
        warnings.warn(
            f"{exc} ({self._mutex.timeout:g} s): this process admits no records for {_ADMIT_PAUSE:g} s "
            "and reads them from storage",
            RuntimeWarning,
            stacklevel=3,
        )

    def _pause_for_memory(self) -> None:
        now = time.monotonic()
        if now < self._paused_until:  # another read-ahead thread of this process paused it just now
            return
        self._paused_until = now + _MEMORY_PAUSE
        self.memory_pauses += 1
        if self.memory_pauses > 1:
            return
        view = self._gauge.last
        warnings.warn(
            f"memory is short ({format_bytes(view.headroom)} free per {view.source}, "
            f"{format_bytes(reserve_bytes(view))} kept free): the cache at {self.path} stops admitting "
            f"records at {format_bytes(int(self._used[0]))} and training goes on reading from "
            f"storage; it looks again every {_MEMORY_PAUSE:g} s",
            RuntimeWarning,
            stacklevel=3,
        )


class _Damaged(ValueError):
    """The store's own files are not a whole store of this version: it is rebuilt."""


def _check_capacity(capacity: int, num_records: int) -> None:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"cache_bytes must be a positive number of bytes, got {capacity!r}")
    if capacity <= index_bytes(num_records):
        raise ValueError(
            f"cache_bytes={capacity} cannot hold even the index of {num_records} records "
            f"({index_bytes(num_records)} bytes); give it more"
        )


def _check_header(header: np.ndarray, path: Path, fingerprint: str, num_records: int) -> None:
    if header["magic"][0] != MAGIC or header["version"][0] != VERSION:
        raise _Damaged(f"{path} is not a stallbench cache of version {VERSION}")
    if header["fingerprint"][0].decode(errors="replace") != fingerprint[:64]:
        raise _Damaged(f"the header of {path} names other data")
    if header["num_records"][0] != num_records:
        raise ValueError(f"the cache at {path} belongs to other data (fingerprint or record count differ)")
