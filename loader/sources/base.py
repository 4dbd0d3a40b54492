"""The Source contract: index -> raw record bytes, a label, and a stable fingerprint."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

__all__ = ["Source"]


class Source(abc.ABC):
    """Random access to the raw records of a dataset.

    A source is picklable (it crosses into DataLoader workers, fork or spawn) and opens its files lazily in
    each process.
    """

    nbytes: int | None = None  # bytes the records take, or an estimate from the file sizes; None if unknown
    thread_safe_reads: bool = False  # read() may run on several threads at once (the loader then reads ahead)
    changes: bool = False  # a record may change under the same fingerprint: a cache asks its ``identity``
    _per_process: tuple[str, ...] = ()  # open handles: not pickled; each process opens its own (see _pid)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in (*self._per_process, "_pid"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _pid=None)

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of records."""

    @abc.abstractmethod
    def read(self, index: int) -> bytes:
        """Raw bytes of record ``index`` from storage. Raises BadRecordError naming the record on failure."""

    def read_admitting(
        self, index: int, admit: Callable[[bytes, bool], bool], takes: Callable[[int], bool] | None = None
    ) -> tuple[bytes, bool]:
        """Record ``index`` read from storage, offered to ``admit(raw, ours)`` (the loader's cache):
        (bytes, admitted).

        ``ours`` says that this read brought every page of the record into the OS page cache (none was
        resident before it), so that memory need not be spent on it twice: the loader then calls ``evict``
        at the record's first hit from its cache. A record that was not admitted, or was given back before
        that hit, keeps its pages, and so do pages that were resident before the read. ``takes(nbytes)``
        says whether the cache would keep a record of that size now: a source of whole files then reads a
        cold one around the page cache (``system.direct``). This default tells nothing (``ours`` False)
        and asks nothing.
        """
        raw = self.read(index)
        return raw, admit(raw, False)

    def identity(self, index: int) -> int:
        """What record ``index`` is now, as 64 bits: a cache keeps it with the record it admits, and a process
        serves the record once this said the same (``MinIOCache.get``, asked once per record in each
        process). Asked before the record is read and again once it is read: a record changed during the
        read is held under its old identity, and served by no process that asks. This default: 0 (a source
        whose records cannot change under it: its fingerprint covers them)."""
        return 0

    @property
    def asked_identity(self) -> Callable[[int], int] | None:
        """What a cache asks of a record before serving it: ``identity`` where records may change
        (``changes``); None where they cannot, and a cache asks nothing (nor keeps what it asked)."""
        return self.identity if self.changes else None

    def evict(self, index: int) -> None:
        """Evict from the page cache the pages of record ``index`` that the read which admitted it brought
        in (it said ``ours``); called once the cache has served the record. This default evicts nothing."""
        return

    @abc.abstractmethod
    def label(self, index: int) -> Any:
        """Label or metadata of record ``index`` (an int class id for images, None where there is none)."""

    @abc.abstractmethod
    def describe(self, index: int) -> str:
        """Where record ``index`` lives, for error messages: a file path, ``path[key]`` or ``path:row``."""

    @property
    @abc.abstractmethod
    def fingerprint(self) -> str:
        """Hex digest: equal for the same data, different when any record is added, removed or changed (a
        source of files: added, removed or renamed; a file's content is told by ``identity``)."""

    def check_index(self, index: int) -> int:
        """Normalise ``index`` like a sequence does, or raise IndexError naming it."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"record index {index} out of range for a source of {n} records")
        return index % n
