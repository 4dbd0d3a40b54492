"""The cache a ``loader.DataLoader`` opens for a source-backed dataset: its size (``cache_bytes``, "auto"
included) and the form of record it holds (``cache_form``: raw bytes or prepared, ``_forms``)."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

from loader._forms import FormChoice, choose_form
from loader._prepared import PreparedRecords, prepared_fingerprint
from loader.cache import MinIOCache
from loader.cache._layout import index_bytes
from loader.datasets import SourceDataset
from loader.system import memory as _memory
from loader.system.headroom import auto_cache_bytes
from loader.system.memory import format_bytes

__all__ = ["SourceCache", "open_cache"]

_ALL_MEMORY = 1 << 62  # what "auto" asks for when it only wants to know the room there is


@dataclasses.dataclass(frozen=True)
class SourceCache:
    """The store (None: none), the prepared records it holds in the prepared form, and why."""

    store: MinIOCache | None = None
    prepared: PreparedRecords | None = None
    sizing: str = ""  # how cache_bytes="auto" chose the capacity
    form: FormChoice | None = None


def open_cache(
    dataset: SourceDataset,
    cache_bytes: int | str | None,
    cache_dir: str | os.PathLike,
    form: str = "auto",
    workers: int = 0,
) -> SourceCache:
    """The loader's cache for ``dataset``, in the form ``form`` asks or the measurement picks."""
    if cache_bytes is None:
        if form != "auto":
            raise ValueError(
                f"cache_form={form!r} needs a cache: set cache_bytes (a number of bytes or 'auto')"
            )
        return SourceCache()
    if cache_bytes != "auto" and (isinstance(cache_bytes, (str, bool)) or not isinstance(cache_bytes, int)):
        raise ValueError(f"cache_bytes must be a number of bytes, 'auto' or None, got {cache_bytes!r}")
    index = index_bytes(len(dataset))
    view = _memory.memory_view() if cache_bytes == "auto" else None  # read once: the room and the size
    room = (auto_cache_bytes(_ALL_MEMORY, view)[0] if view is not None else cache_bytes) - index
    choice = choose_form(dataset, form, max(room, 0), workers, sizing=cache_bytes == "auto")
    sizing = ""
    if view is not None:
        cache_bytes, sizing = auto_cache_bytes(index + _records_bytes(dataset, choice), view)
        if cache_bytes <= index:
            warnings.warn(
                f"cache_bytes='auto' makes no cache ({sizing}); reading from storage", RuntimeWarning, 3
            )
            return SourceCache(sizing=sizing, form=choice)
    prepared = choice.form == "prepared"
    fingerprint = dataset.source.fingerprint
    if prepared:
        fingerprint = prepared_fingerprint(fingerprint, dataset.transform.identity)
    try:
        store = MinIOCache.open(
            fingerprint=fingerprint,
            num_records=len(dataset),
            capacity=cache_bytes,
            cache_dir=cache_dir,
            warn_capacity=not sizing,
        )
    except OSError as exc:  # /dev/shm full or not writable: train on without the cache
        warnings.warn(
            f"the cache in {cache_dir} cannot be made ({exc}); reading from storage only", stacklevel=3
        )
        return SourceCache(sizing=sizing, form=choice)
    if sizing and store.capacity != cache_bytes:
        sizing += f"; the cache already held this data with {format_bytes(store.capacity)} and is used as is"
    records = PreparedRecords(store, dataset.transform) if prepared else None
    return SourceCache(store, records, sizing, choice)


def _records_bytes(dataset: SourceDataset, choice: FormChoice) -> int:
    """What the records take in the chosen form: the source's bytes raw; the measured size of a prepared
    record times the records, with 10% to spare (sizes vary), prepared."""
    if choice.form == "prepared":
        return int(choice.prepared_bytes * len(dataset) * 1.1)
    records: Any = dataset.source.nbytes
    return records if records is not None else _ALL_MEMORY
