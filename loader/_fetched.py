"""What fetching one record gave (``Fetched``), what a batch's records cost (``BatchCost``), and the stand-in
for a record skipped under ``on_error="skip"`` (``SKIPPED``)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["SKIPPED", "BatchCost", "Fetched"]


class _Skipped:
    """Stands in for a bad record under ``on_error="skip"``; the loader's collate drops it."""

    def __reduce__(self) -> str:
        return "SKIPPED"

    def __repr__(self) -> str:
        return "SKIPPED"


SKIPPED = _Skipped()


class Fetched(NamedTuple):
    """One record's raw bytes and how they were had; counted by the worker's own thread."""

    raw: bytes
    hit: bool
    admitted: bool
    seconds: float
    corrupt: bool = False  # the cache held it but failed its check: read from the source instead
    memory_pause: bool = False  # the cache began a pause in admission because memory was short
    peer: bool = False  # sent by the node that caches it (partitioned cache)


class BatchCost:
    """What one batch's records cost, summed by the worker's own thread: what the read-ahead switch weighs."""

    __slots__ = ("decode_seconds", "fetch_seconds", "miss_bytes", "miss_seconds", "misses", "nbytes")

    def __init__(self) -> None:
        self.fetch_seconds = self.decode_seconds = self.miss_seconds = 0.0
        self.nbytes = self.misses = self.miss_bytes = 0
