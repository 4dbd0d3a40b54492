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
        """Hold ``read`` (in place of one held for the same key); whether those held now pass ``HELD_BYTES``
        (``flush`` them)."""
        with _LOCK:
            before = self.reads.get(key)
            self.reads[key] = read
            self.nbytes += len(read.record.payload) - (0 if before is None else len(before.record.payload))
            return self.nbytes > HELD_BYTES

    def flush(self, admit: Callable[[dict[tuple[int, int], Held]], int]) -> int:
        """Admit those held now (``admit`` says how many it admitted); how many have been admitted since the
        first was held. One flush at a time, so a thread's admissions are counted before another's flush
        reads the count; a read held after the last flush (by a thread still reading) is not admitted."""
        with _LOCK:
            reads, self.reads, self.nbytes = self.reads, {}, 0
            if reads:
                self.admitted += admit(reads)
            return self.admitted
