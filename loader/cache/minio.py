"""The node-local minimal-miss (MinIO) store: admit records until full, never evict.

Every epoch of a random-order job touches every record once, so the records to keep are any ``capacity``
of them, kept forever: each later epoch then hits exactly ``capacity / dataset`` of its reads, which is the
best any policy can do (see docs/concepts/minio-cache.md). One store per dataset fingerprint lives in
``cache_dir`` (``/dev/shm`` by default), shared by every worker and every job that reads the same source,
and it outlives the job, so the next run starts warm.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import shutil
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loader.cache._layout import (
    EMPTY,
    HEADER_DTYPE,
    MAGIC,
    READY,
    RESERVED,
    SLOT_DTYPE,
    VERSION,
    index_bytes,
)
from loader.cache._storefiles import create_store

__all__ = ["CacheInfo", "MinIOCache", "store_path"]

_setup_lock = threading.Lock()  # guards each process's one-time lock setup; new in a forked child


def _new_setup_lock() -> None:
    global _setup_lock
    _setup_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_setup_lock)


@dataclass(frozen=True)
class CacheInfo:
    """What a store holds right now, over every process and job that shares it."""

    path: Path
    capacity: int
    bytes_used: int
    records_cached: int
    full: bool


def store_path(cache_dir: str | os.PathLike, fingerprint: str) -> Path:
    """Where the store of a source with ``fingerprint`` lives: private to this user, one per source."""
    return Path(cache_dir) / f"stallbench-minio-{os.getuid()}-{fingerprint[:32]}"


class MinIOCache:
    """A fixed-capacity record store in shared memory; safe for many processes to read and fill at once."""

    def __init__(self, path: Path, fingerprint: str, num_records: int) -> None:
        self.path = path
        self._fingerprint = fingerprint
        self._num_records = num_records
        self._attach()

    @classmethod
    def open(
        cls, *, fingerprint: str, num_records: int, capacity: int, cache_dir: str | os.PathLike = "/dev/shm"
    ) -> MinIOCache:
        """Attach to this source's store in ``cache_dir``, creating it with ``capacity`` bytes if absent."""
        _check_capacity(capacity, num_records)
        if not Path(cache_dir).is_dir():
            raise ValueError(f"cache_dir {str(cache_dir)!r} is not an existing directory")
        path = store_path(cache_dir, fingerprint)
        if not path.exists():
            create_store(path, fingerprint=fingerprint, num_records=num_records, capacity=capacity)
        store = cls(path, fingerprint, num_records)
        if store.capacity != capacity:
            warnings.warn(
                f"the cache at {path} was made with capacity {store.capacity} bytes; using it as it is "
                f"(cache_bytes={capacity} applies only to a new cache)",
                RuntimeWarning,
                stacklevel=2,
            )
        return store

    @property
    def capacity(self) -> int:
        return int(self._header["capacity"][0])

    def get(self, index: int) -> bytes | None:
        """The cached bytes of record ``index``, or None when the store does not hold it."""
        if self._state[index] != READY:
            return None
        return os.pread(self._data_fd, int(self._length[index]), int(self._offset[index]))

    def admit(self, index: int, payload: bytes) -> bool:
        """Store record ``index`` if there is room; True when it was admitted by this call."""
        if self._full_here or self._header["full"][0]:
            return False
        offset = self._reserve(index, len(payload))
        if offset is None:
            return False
        if not self._write(payload, offset):
            return False
        self._state[index] = READY  # one aligned 4-byte store: the record becomes visible whole
        return True

    def info(self) -> CacheInfo:
        return CacheInfo(
            path=self.path,
            capacity=self.capacity,
            bytes_used=int(self._header["used"][0]) + index_bytes(self._num_records),
            records_cached=int(np.count_nonzero(self._state == READY)),
            full=bool(self._header["full"][0]),
        )

    def destroy(self) -> None:
        """Remove the store from ``cache_dir`` (other processes still attached keep their mapping)."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def close(self) -> None:
        lock_fd = self._lock_state[1] if self._lock_state[0] == os.getpid() else None
        for fd in (self._data_fd, lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._data_fd, self._lock_state = None, (-1, None, None)

    def __getstate__(self) -> dict:
        return {"path": self.path, "fingerprint": self._fingerprint, "num_records": self._num_records}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["fingerprint"], state["num_records"])

    def _attach(self) -> None:
        index_fd = os.open(self.path / "index", os.O_RDWR)
        try:
            self._map = mmap.mmap(index_fd, 0)
        finally:
            os.close(index_fd)
        self._header = np.frombuffer(self._map, HEADER_DTYPE, count=1)
        _check_header(self._header, self.path, self._fingerprint, self._num_records)
        if len(self._map) != index_bytes(self._num_records):
            raise ValueError(f"the cache index {self.path / 'index'} has the wrong size; remove {self.path}")
        slots = np.frombuffer(self._map, SLOT_DTYPE, count=self._num_records, offset=4096)
        self._offset, self._length, self._state = slots["offset"], slots["length"], slots["state"]
        self._data_fd = os.open(self.path / "data", os.O_RDWR)
        self._lock_state: tuple[int, int, threading.Lock] | tuple[int, None, None] = (-1, None, None)
        self._full_here = False

    @contextlib.contextmanager
    def _locked(self):
        """Excludes other processes (flock, released by the kernel if the holder dies) and other threads."""
        fd, thread_lock = self._process_lock()
        with thread_lock:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _process_lock(self) -> tuple[int, threading.Lock]:
        """This process's lock file (flock is per open file, so each process opens its own) and a thread
        lock (threads share that open file, so flock alone would let them all in); made once per process."""
        state = self._lock_state
        if state[0] != os.getpid():
            with _setup_lock:
                state = self._lock_state
                if state[0] != os.getpid():
                    state = (os.getpid(), os.open(self.path / "lock", os.O_RDWR), threading.Lock())
                    self._lock_state = state
        return state[1], state[2]

    def _reserve(self, index: int, length: int) -> int | None:
        with self._locked():
            header = self._header
            if header["full"][0] or self._state[index] != EMPTY:
                return None
            used = int(header["used"][0])
            if used + length > int(header["data_capacity"][0]):
                header["full"][0] = 1
                return None
            header["used"][0] = used + length  # space first: a writer killed now only wastes it
            self._offset[index], self._length[index] = used, length
            self._state[index] = RESERVED
            return used

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
        self._header["full"][0] = 1
        warnings.warn(
            f"no space left for the cache at {self.path}: it stops admitting records at "
            f"{int(self._header['used'][0])} bytes; training goes on reading from storage",
            RuntimeWarning,
            stacklevel=3,
        )
        return False


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
        raise ValueError(f"{path} is not a stallbench cache of version {VERSION}; remove it")
    if header["fingerprint"][0].decode() != fingerprint[:64] or header["num_records"][0] != num_records:
        raise ValueError(f"the cache at {path} belongs to other data (fingerprint or record count differ)")
