"""A store's files attached to this process: the index and data of one dataset's store, mapped, checked,
and shared with workers by pickling only where it lives.

One store per dataset fingerprint lives in this user's private folder of ``cache_dir`` (by default on a local
disk, ``system.home``: its pages are page cache the kernel can take back), shared by every worker and every
job of the user that reads the same source, and it outlives the job, so the next run starts warm. What a
store admits and serves is its policy's (``minio.py``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np

from loader.cache._admission import AdmissionGate
from loader.cache._attached import note_attached
from loader.cache._layout import HEADER_BYTES, HEADER_DTYPE, READY, SLOT_DTYPE, index_bytes
from loader.cache._storefiles import StoreDamaged, check_capacity, check_header, create_store
from loader.system.home import default_cache_dir, holds_memory
from loader.system.locks import StoreMutex, forget_writer
from loader.system.private import check_private, open_private, user_dir

__all__ = ["LOCK_TIMEOUT", "CacheInfo", "SharedStore", "store_path"]

LOCK_TIMEOUT = 5.0  # seconds a writer waits for the store's lock before it reads on without admitting


@dataclass(frozen=True)
class CacheInfo:
    """What a store holds right now, over every process and job that shares it; what it gave back since it
    was made because the job grew into the memory the cache keeps free, with the job's own memory and its
    limit the last time (``given_back_at``); whether its pages are memory the kernel cannot take back
    (``in_memory``: a tmpfs) rather than page cache."""

    path: Path
    capacity: int
    bytes_used: int
    records_cached: int
    full: bool
    bytes_given_back: int = 0
    records_given_back: int = 0
    given_back_at: tuple[int, int] = (0, 0)
    in_memory: bool = False


def store_path(cache_dir: str | os.PathLike, fingerprint: str) -> Path:
    """Where the store of a source with ``fingerprint`` lives: in this user's folder of ``cache_dir`` (its
    first choice: where another user took that folder's name, the next free one, ``user_dir``)."""
    return Path(cache_dir) / f"stallbench-{os.geteuid()}" / f"minio-{fingerprint[:64]}"


class SharedStore:
    """A fixed-capacity record store in shared memory, attached to this process; safe for many processes
    to attach at once. Each process has its own admission gate (see ``_admission``)."""

    def __init__(
        self, path: Path, fingerprint: str, num_records: int, lock_timeout: float = LOCK_TIMEOUT
    ) -> None:
        self.path = path
        self._fingerprint = fingerprint
        self._num_records = num_records
        self._mutex = StoreMutex(path, lock_timeout)
        self.in_memory = holds_memory(path)  # a tmpfs: pages the kernel cannot take back
        self._gate = AdmissionGate(path, self.in_memory)
        self._attach()
        note_attached(self)

    @classmethod
    def open(
        cls,
        *,
        fingerprint: str,
        num_records: int,
        capacity: int,
        cache_dir: str | os.PathLike | None = None,
        lock_timeout: float = LOCK_TIMEOUT,
        warn_capacity: bool = True,
        limit: int | None = None,
    ) -> Self:
        """Attach to this source's store in ``cache_dir`` (None: ``system.home.default_cache_dir``), creating
        it with ``capacity`` bytes if absent, of which its records may fill ``limit`` (None: all; an
        existing store keeps its own capacity and limit: ``warn_capacity`` warns when its capacity differs).

        Raises UntrustedCacheError (a PermissionError) naming the path and its owner when the folder or a
        file in the way is not this user's own and private.
        """
        check_capacity(capacity, num_records)
        cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        if not Path(cache_dir).is_dir():
            raise ValueError(f"cache_dir {str(cache_dir)!r} is not an existing directory")
        path = user_dir(Path(cache_dir), "cache_dir") / store_path(cache_dir, fingerprint).name
        try:
            store = cls._attach_or_create(path, fingerprint, num_records, capacity, limit, lock_timeout)
        except StoreDamaged as exc:
            warnings.warn(f"{exc}; the cache is made anew", RuntimeWarning, stacklevel=2)
            shutil.rmtree(path, ignore_errors=True)
            store = cls._attach_or_create(path, fingerprint, num_records, capacity, limit, lock_timeout)
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
        cls, path: Path, fingerprint: str, num_records: int, capacity: int, limit: int | None, timeout: float
    ) -> Self:
        if not os.path.lexists(path):
            create_store(
                path, fingerprint=fingerprint, num_records=num_records, capacity=capacity, limit=limit
            )
        return cls(path, fingerprint, num_records, timeout)

    @property
    def capacity(self) -> int:
        """The bytes the store's files were made for: its index and the most its records may take."""
        return int(self._header["capacity"][0])

    @property
    def limit(self) -> int:
        """The bytes of records the store may hold now (``data_capacity`` or less: see ``set_limit``)."""
        return int(self._limit[0])

    def info(self) -> CacheInfo:
        """What it holds; ``capacity``: its index and the records it may hold now (its limit)."""
        header = self._header[0]
        return CacheInfo(
            path=self.path,
            capacity=index_bytes(self._num_records) + self.limit,
            bytes_used=int(self._used[0]) + index_bytes(self._num_records),
            records_cached=int(np.count_nonzero(self._state >= READY)),
            full=bool(self._full[0]),
            bytes_given_back=int(header["given_back"]),
            records_given_back=int(header["records_given_back"]),
            given_back_at=(int(header["own_at_give_back"]), int(header["limit_at_give_back"])),
            in_memory=self.in_memory,
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
            self.in_memory = False
            self._gate = AdmissionGate(self.path, self.in_memory)
            self._gate.turn_off(exc)

    def _payload(self, offset: int, length: int, mutable: bool) -> bytes | bytearray | np.ndarray:
        """The ``length`` bytes at ``offset`` of the data: a pread on a disk, one copy out of the mapping in
        a tmpfs (a third cheaper than pread there, ``_attach``; the caller checks first that they lie within
        the file: a copy from past its end would be a SIGBUS). Mutable from a disk: read into an array left
        unset, not a bytearray zeroed first (27 against 40 us for a 563 kB prepared record)."""
        if not self.in_memory:
            if not mutable:
                return os.pread(self._data_fd, length, offset)
            raw = np.empty(length, np.uint8)
            return raw[: os.preadv(self._data_fd, [raw], offset)]
        window = slice(offset, offset + length)
        return bytearray(memoryview(self._data)[window]) if mutable else self._data[window]

    def _attach(self) -> None:
        check_private(os.lstat(self.path), self.path, want=stat.S_IFDIR)  # again in every process
        index_fd = open_private(self.path, "index", os.O_RDWR)
        try:
            size = os.fstat(index_fd).st_size
            if size < HEADER_BYTES:
                raise StoreDamaged(f"the cache index {self.path / 'index'} is truncated")
            self._map = mmap.mmap(index_fd, 0)
        finally:
            os.close(index_fd)
        self._header = np.frombuffer(self._map, HEADER_DTYPE, count=1)
        check_header(self._header, self.path, self._fingerprint, self._num_records)
        # views of the header's fields, made once: a field lookup on each admission costs a microsecond
        self._full, self._used, self._limit = (
            self._header["full"],
            self._header["used"],
            self._header["limit"],
        )
        self._data_capacity = int(self._header["data_capacity"][0])
        if size != index_bytes(self._num_records):
            raise StoreDamaged(f"the cache index {self.path / 'index'} has the wrong size")
        slots = np.frombuffer(self._map, SLOT_DTYPE, count=self._num_records, offset=HEADER_BYTES)
        fields = (slots[name] for name in SLOT_DTYPE.names)  # in the layout's order
        (
            self._offset,
            self._length,
            self._state,
            self._checksum,
            self._writer,
            self._generation,
            self._identity,
        ) = fields
        self._verified: bytearray | None = None  # the records whose identity this process found the same
        self._data_fd = open_private(self.path, "data", os.O_RDWR)
        self._data_bytes = min(self._data_capacity, os.fstat(self._data_fd).st_size)
        # in a tmpfs, hits are copied out of a read-only mapping: 12 us per 112 KB record against pread's
        # 18 us (the kernel walks tmpfs page by page); slots are bounds-checked against _data_bytes first.
        # On a disk, a record whose pages the kernel took back would be faulted in with the pages around it
        # (a mapping reads ahead and behind): 2-3x the store's bytes per epoch, measured. There hits are read
        # with pread (the same 11 us per 112 KB record from the page cache), the file's readahead off.
        self._data: mmap.mmap | bytes = b""
        if self.in_memory and self._data_bytes:
            self._data = mmap.mmap(self._data_fd, self._data_bytes, prot=mmap.PROT_READ)
        elif not self.in_memory:
            os.posix_fadvise(self._data_fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._full_here = False
