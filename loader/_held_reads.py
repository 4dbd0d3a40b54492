"""The reads a loader holds for admission at a batch's end (``CachedFiles.hold_admissions``): by store and
index, with their bytes, and how many of those held before were admitted already."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

from loader.cache import Admission

__all__ = ["HELD_BYTES", "Held", "HeldReads"]

HELD_BYTES = 8 << 20  # reads held for admission at a batch's end at most: past it, those held are admitted
_LOCK = threading.Lock()  # over every loader's held reads (a lock of each would not pickle with it)


class Held(NamedTuple):
    """A read held for admission: the record, how to evict the pages it brought in."""

    record: Admission
    evict: Callable[[], None]


class HeldReads:
    """The reads held for admission (by store and index), their bytes, and how many of those held before
    were admitted already; threads of the Dataset's own may add to them while they are taken."""

    def __init__(self) -> None:
        self.reads: dict[tuple[int, int], Held] = {}
        self.nbytes = self.admitted = 0

    def hold(self, key: tuple[int, int], read: Held) -> bool:
        """Hold ``read``; whether those held now pass ``HELD_BYTES`` (take them and admit them)."""
        with _LOCK:
            self.reads[key] = read
            self.nbytes += len(read.record.payload)
            return self.nbytes > HELD_BYTES

    def take(self) -> dict[tuple[int, int], Held]:
        with _LOCK:
            reads, self.reads, self.nbytes = self.reads, {}, 0
        return reads

    def count(self, admitted: int) -> None:
        with _LOCK:
            self.admitted += admitted
