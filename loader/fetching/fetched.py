"""What fetching one record gave (``Fetched``), a fetch of its raw bytes through the cache (``fetch_raw``; its
hit half, ``served``, is also ``CachedFiles``'), what a batch's records cost (``BatchCost``), how a fetch is
counted (``note_fetch``), and the stand-in for a record skipped under ``on_error="skip"`` (``SKIPPED``)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import NamedTuple

from loader.cache import CorruptRecordError, MinIOCache
from loader.errors import BadRecordError
from loader.sources import Source

__all__ = ["SKIPPED", "BatchCost", "Fetched", "admitting", "fetch_raw", "kept_out", "note_fetch", "served"]


class _Skipped:
    """Stands in for a bad record under ``on_error="skip"``; the loader's collate drops it."""

    def __reduce__(self) -> str:
        return "SKIPPED"

    def __repr__(self) -> str:
        return "SKIPPED"


SKIPPED = _Skipped()


class Fetched(NamedTuple):
    """One record's raw bytes and how they were had; counted by the worker's own thread."""

    raw: bytes | bytearray  # a bytearray: a prepared record, whose sample's arrays are views of it
    hit: bool
    admitted: bool
    seconds: float
    corrupt: bool = False  # the cache held it but failed its check: read from the source instead
    memory_pause: bool = False  # the cache began a pause in admission because memory was short
    peer: bool = False  # sent by the node that caches it (partitioned cache)
    prepared: bool = False  # ``raw`` holds the record prepared (``loader.form.prepared``), not its raw bytes
    identity: int = 0  # what the source said of the record before this read (``Source.identity``)


def served(
    cache: MinIOCache, index: int, evict: Callable[[], None], identity: Callable[[int], int] | None
) -> tuple[bytes | None, bool]:
    """(record ``index``'s bytes from ``cache`` or None, whether its copy there failed its check), served
    only while ``identity(index)`` says what it said when the record was admitted (None: the caller has
    checked). The first hit since a read that left the record's pages in the page cache calls ``evict()``:
    advisory, a failure of it never fails the hit."""
    try:
        raw = cache.get(index, identity)
    except CorruptRecordError:
        return None, True
    if raw is not None and cache.first_hit(index):
        with contextlib.suppress(OSError, BadRecordError):  # the file is gone, or the record is bad
            evict()
    return raw, False


def fetch_raw(
    cache: MinIOCache,
    source: Source,
    index: int,
    start: float,
    corrupt: bool,
    held_elsewhere: Callable[[int], bool],
) -> Fetched:
    """Record ``index``'s raw bytes from ``cache`` (the first hit since a read that left the record's pages
    in the page cache evicts them), else from ``source``, admitted where the cache accepts it and the record
    is not ``held_elsewhere`` (prepared); ``start``: when the fetch began; ``corrupt``: a copy failed its
    check."""
    asks = source.asked_identity
    raw, damaged = served(cache, index, lambda: source.evict(index), asks)
    corrupt = corrupt or damaged
    if raw is not None:
        return Fetched(raw, True, False, time.perf_counter() - start)
    evict = functools.partial(source.evict, index)
    identity = source.identity(index)  # before the read: bytes changed during it are never served
    if corrupt or not cache.accepting(index) or held_elsewhere(index):
        if cache.crowded():
            raw = source.read_admitting(index, kept_out(evict), _anything)[0]
        else:
            raw = source.read(index)
        return Fetched(raw, False, False, time.perf_counter() - start, corrupt, identity=identity)
    pauses = cache.memory_pauses
    raw, admitted = source.read_admitting(
        index, admitting(cache, index, evict, identity), lambda nbytes: cache.takes(index, nbytes)
    )
    paused = cache.memory_pauses != pauses
    if admitted and asks is not None:  # asked again once read, unchanged: no need to ask at its hit
        cache.same_identity(index, asks)
    return Fetched(raw, False, admitted, time.perf_counter() - start, memory_pause=paused, identity=identity)


def admitting(
    cache: MinIOCache, index: int, evict: Callable[[], None], identity: int
) -> Callable[[bytes, bool], bool]:
    """``read_admitting``'s ``admit`` for record ``index`` of ``identity``: the store takes it, or, where the
    store is crowded (``MinIOCache.crowded``), the pages the read brought in are evicted at once."""

    def admit(raw: bytes, ours: bool) -> bool:
        if cache.admit(index, raw, ours, identity):
            return True
        if ours and cache.crowded():
            evict()
        return False

    return admit


def _anything(nbytes: int) -> bool:
    """``read_admitting``'s ``takes`` for a record read around the page cache: a cold file, read directly."""
    return True


def kept_out(evict: Callable[[], None]) -> Callable[[bytes, bool], bool]:
    """``read_admitting``'s ``admit`` for a record read around the page cache: admits nothing, and evicts the
    pages the read brought in (a file it could not read directly, ``_anything``: a cold one it reads so)."""

    def admit(raw: bytes, ours: bool) -> bool:
        if ours:
            evict()
        return False

    return admit


class BatchCost:
    """What one batch's records cost, summed by the worker's own thread: what the read-ahead switch weighs."""

    __slots__ = ("decode_seconds", "fetch_seconds", "miss_bytes", "miss_seconds", "misses", "nbytes")

    def __init__(self) -> None:
        self.fetch_seconds = self.decode_seconds = self.miss_seconds = 0.0
        self.nbytes = self.misses = self.miss_bytes = 0


def note_fetch(count: Callable[[str, float], None] | None, spent: BatchCost | None, got: Fetched) -> None:
    """Count ``got`` into the loader's stats (``count``: its board's ``add``; None: not counted) and into the
    batch's ``spent`` (None: no batch weighs it). Runs once per record: a hit takes three counts and no
    more."""
    size = len(got.raw)
    if spent is not None:
        spent.fetch_seconds += got.seconds
        spent.nbytes += size
        if not (got.hit or got.peer):
            spent.misses += 1
            spent.miss_seconds += got.seconds
            spent.miss_bytes += size
    if count is None:
        return
    count("fetch_seconds", got.seconds)
    if got.hit:
        count("hits", 1)
        count("bytes_from_cache", size)
        return
    if got.peer:
        count("peer_hits", 1)
        count("bytes_from_peers", size)
    else:
        count("misses", 1)
        count("bytes_from_source", size)
        count("miss_seconds", got.seconds)
    for field, flag in (
        ("records_admitted", got.admitted),
        ("records_corrupt", got.corrupt),
        ("memory_pauses", got.memory_pause),
    ):
        if flag:
            count(field, 1)
