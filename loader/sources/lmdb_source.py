"""LMDB environments in the stallbench record layout.

Layout (a directory holding ``data.mdb``):

* ``b"__len__"`` -> the record count as ASCII decimal, written last by the converter;
* ``b"__classes__"`` -> a JSON list of class names (optional);
* ``b"__labels__"`` -> every label as 4-byte big-endian ints, ``">i4"`` (optional; without it ``label(i)``
  reads record ``i`` from storage, so a cache hit would still cost a storage read);
* record ``i``: key ``struct.pack(">Q", i)`` (8-byte big-endian), value ``struct.pack(">i", label)`` (4-byte
  big-endian, -1 for none) followed by the raw record bytes.

The environment is opened with ``readahead=False`` (MADV_RANDOM), so a read brings in only its own pages. But
py-lmdb touches every page of a value inside ``get``, one fault at a time, before a prefetch could be issued:
a cold value of P pages costs P synchronous faults (see docs/sources.md for measured rates). For the same
reason the source cannot learn which of a value's pages were resident before its read, so it never evicts
any: an admitted record's pages stay in the page cache too, where the kernel reclaims them as it needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
import weakref
from collections.abc import Callable
from typing import TypeVar

import lmdb
import numpy as np

from loader.errors import BadRecordError, SourceError
from loader.sources._fingerprint import digest
from loader.sources.base import Source

__all__ = ["CLASSES_KEY", "LABELS_KEY", "LEN_KEY", "LMDBSource", "pack_record", "record_key"]

LEN_KEY = b"__len__"
CLASSES_KEY = b"__classes__"
LABELS_KEY = b"__labels__"
_KEY = struct.Struct(">Q")
_LABEL = struct.Struct(">i")
_SAMPLES = 16
T = TypeVar("T")


def record_key(index: int) -> bytes:
    """The key of record ``index``."""
    return _KEY.pack(index)


def pack_record(label: int | None, data: bytes) -> bytes:
    """The value of one record: its label (-1 for none) and its raw bytes."""
    return _LABEL.pack(-1 if label is None else label) + data


_envs: weakref.WeakValueDictionary[str, lmdb.Environment] = weakref.WeakValueDictionary()
_envs_pid = os.getpid()


def _open_env(path: str) -> lmdb.Environment:
    """One read-only environment per folder per process, shared by its sources (LMDB refuses a second open).

    A forked child first closes the handles it inherited: they must not be used there, and they would block
    the reopen. The environment closes when its last source is gone.
    """
    global _envs_pid
    if _envs_pid != os.getpid():
        for env in list(_envs.values()):
            env.close()
        _envs.clear()
        _envs_pid = os.getpid()
    key = os.path.realpath(path)
    env = _envs.get(key)
    if env is None:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False)
        _envs[key] = env
    return env


class LMDBSource(Source):
    """Records of an LMDB environment, opened read-only, without locks or readahead, once per process."""

    _per_process = ("_handle",)

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._data_file = os.path.join(self.path, "data.mdb")
        self._pid: int | None = None
        self._fingerprint: str | None = None
        self._warned = False
        with self._env().begin() as txn:
            count, classes, labels = (txn.get(k) for k in (LEN_KEY, CLASSES_KEY, LABELS_KEY))
        if count is None or not count.isdigit():
            raise SourceError(f"LMDB {self.path!r} has no valid {LEN_KEY!r} key (an unfinished conversion?)")
        self._len = int(count)
        self.nbytes = os.path.getsize(self._data_file)  # the records and the B-tree around them
        self.classes: list[str] | None = None if classes is None else json.loads(classes)
        if labels is not None and len(labels) != _LABEL.size * self._len:
            raise SourceError(
                f"LMDB {self.path!r}: {LABELS_KEY!r} holds {len(labels)} bytes for {count} labels"
            )
        self._labels = None if labels is None else np.frombuffer(labels, dtype=">i4")

    def _env(self) -> lmdb.Environment:
        """This process's environment; a forked or unpickled copy opens its own."""
        if self._pid != os.getpid():
            if not os.path.isfile(self._data_file):
                raise SourceError(f"LMDB {self.path!r} does not exist or has no data.mdb")
            try:
                self._handle = _open_env(self.path)
            except lmdb.Error as e:
                raise SourceError(
                    f"LMDB {self.path!r} is not an LMDB environment or cannot be opened: {e}"
                ) from e
            self._pid = os.getpid()
        return self._handle

    def __len__(self) -> int:
        return self._len

    def read(self, index: int) -> bytes:
        return self._lookup(index, lambda value: bytes(value[_LABEL.size :]))

    def label(self, index: int) -> int | None:
        """From ``__labels__``; without it, from the record's value, which reads the record from storage."""
        i = self.check_index(index)
        if self._labels is not None:
            label = int(self._labels[i])
        else:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"LMDB {self.path!r} has no {LABELS_KEY!r} key: each label() reads its record",
                    stacklevel=2,
                )
            label = self._lookup(i, lambda value: _LABEL.unpack_from(value)[0])
        return None if label == -1 else label

    def describe(self, index: int) -> str:
        return f"{self.path}[{index}]"

    def _lookup(self, index: int, take: Callable[[memoryview], T]) -> T:
        """``take`` applied to record ``index``'s value while mapped."""
        i = self.check_index(index)
        with self._env().begin(buffers=True) as txn:
            value = txn.get(record_key(i))
            if value is None:
                raise BadRecordError(self.describe(i), i, "no such key in the LMDB")
            if len(value) < _LABEL.size:
                raise BadRecordError(self.describe(i), i, f"value truncated to {len(value)} bytes")
            return take(value)

    @property
    def fingerprint(self) -> str:
        """Digest of the count, data.mdb's size and mtime, and ~16 evenly spaced values."""
        if self._fingerprint is None:
            st = os.stat(self._data_file)
            samples = sorted({k * self._len // _SAMPLES for k in range(_SAMPLES)} if self._len else set())
            values = (self._value_digest(i) for i in samples)
            self._fingerprint = digest([self._len, st.st_size, st.st_mtime_ns, *values])
        return self._fingerprint

    def _value_digest(self, index: int) -> str:
        """A sampled value's digest; a bad record is part of the data as it is, not a reason to refuse it."""
        try:
            return self._lookup(index, lambda value: hashlib.sha256(value).hexdigest())
        except BadRecordError as exc:
            return f"bad record: {exc.reason}"
