"""The cache a ``loader.DataLoader`` opens for a source-backed dataset: its size (``cache_bytes``, "auto"
included) and the form of record it holds (``cache_form``: raw bytes or prepared, ``loader.form.choice``).

Where the loader chooses the form (``"auto"`` with a staged transform) it opens two stores, raw and prepared,
each with files that may take all the room there is, and splits the room between them by their limits: the
form chosen sets the split, and ``loader.form.revisit`` moves it as the job's own measurements come in.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

from loader.cache import MinIOCache
from loader.cache._layout import index_bytes
from loader.datasets import SourceDataset
from loader.form.choice import choose_form
from loader.form.prepared import PreparedRecords, prepared_fingerprint
from loader.form.revisit import FormRevisit
from loader.form.weighing import FormChoice
from loader.system import memory as _memory
from loader.system.memory import format_bytes
from loader.system.sizing import sized_cache_bytes

__all__ = ["SourceCache", "open_cache"]

_ALL_MEMORY = 1 << 62  # what "auto" asks for when it only wants to know the room there is


@dataclasses.dataclass(frozen=True)
class SourceCache:
    """The store of raw records (None: none, or the prepared form), the prepared records, and why.

    A forced form holds ``raw`` or ``prepared`` only; a chosen one both, split by ``revisit``."""

    raw: MinIOCache | None = None
    prepared: PreparedRecords | None = None
    sizing: str = ""  # how cache_bytes="auto" chose the capacity
    form: FormChoice | None = None
    revisit: FormRevisit | None = None

    @property
    def stores(self) -> tuple[MinIOCache, ...]:
        """The stores the cache holds records in: raw first."""
        prepared = (self.prepared.store,) if self.prepared is not None else ()
        return (self.raw,) * (self.raw is not None) + prepared


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
    if cache_bytes != "auto" and (
        isinstance(cache_bytes, (str, bool)) or not isinstance(cache_bytes, int) or cache_bytes <= 0
    ):
        raise ValueError(
            f"cache_bytes must be a positive number of bytes, 'auto' or None, got {cache_bytes!r}"
        )
    index = index_bytes(len(dataset))
    view = _memory.memory_view()  # read once: the room and the size
    auto = cache_bytes == "auto"
    # all the cache may take: for the forms to weigh, and for the files of a form's two stores
    asked = cache_bytes
    most, sizing = sized_cache_bytes(asked, _ALL_MEMORY if auto else asked, cache_dir, view)
    choice = choose_form(dataset, form, max(most - index, 0), workers)
    # a form chosen is held in two stores, where the room holds their two indexes; else one, as chosen
    indexes = 2 if form == "auto" and choice.probe is not None and most > 2 * index else 1
    cache_bytes = most
    if auto:
        wanted = indexes * index + _records_bytes(dataset, choice)
        cache_bytes, sizing = sized_cache_bytes("auto", wanted, cache_dir, view)
    if (auto or sizing) and cache_bytes <= indexes * index:
        warnings.warn(
            f"cache_bytes={asked!r} makes no cache ({sizing}); reading from storage", RuntimeWarning, 3
        )
        return SourceCache(sizing=sizing, form=choice)
    opening = _Opening(dataset, cache_dir, warn_capacity=not auto)
    try:
        opened = (
            opening.open(choice, cache_bytes) if indexes == 1 else opening.split(choice, cache_bytes, most)
        )
    except OSError as exc:  # /dev/shm full or not writable: train on without the cache
        opening.close()
        warnings.warn(
            f"the cache in {cache_dir} cannot be made ({exc}); reading from storage only", stacklevel=3
        )
        return SourceCache(sizing=sizing, form=choice)
    held = sum(store.info().capacity for store in opening.stores)
    if auto and held != cache_bytes:
        sizing += f"; the cache already held this data with {format_bytes(held)} and is used as is"
    revisit = None
    if indexes == 2:
        revisit = FormRevisit(choice, opened.raw, opened.prepared.store, len(dataset), workers)
    return dataclasses.replace(opened, sizing=sizing, form=choice, revisit=revisit)


class _Opening:
    """The stores of one cache, opened in turn; ``close`` closes those opened when a later one fails."""

    def __init__(self, dataset: SourceDataset, cache_dir: str | os.PathLike, warn_capacity: bool) -> None:
        self.dataset, self.cache_dir, self.warn_capacity = dataset, cache_dir, warn_capacity
        self.stores: list[MinIOCache] = []
        self.index = index_bytes(len(dataset))

    def open(self, choice: FormChoice, cache_bytes: int) -> SourceCache:
        """The one store of a forced form, of a transform in one stage (raw bytes), or of a cache too small
        for two indexes (a mix then holds raw bytes)."""
        raw_fingerprint = self.dataset.source.fingerprint
        if choice.form != "prepared":
            return SourceCache(raw=self._store(raw_fingerprint, cache_bytes))
        fingerprint = prepared_fingerprint(raw_fingerprint, self.dataset.transform.identity)
        return SourceCache(
            prepared=PreparedRecords(self._store(fingerprint, cache_bytes), self.dataset.transform)
        )

    def split(self, choice: FormChoice, cache_bytes: int, most: int) -> SourceCache:
        """Both stores, their files made for ``most`` bytes each (all the room a revisit may give one form),
        the ``cache_bytes`` they may hold now split as ``choice`` says. Stores already there keep their
        limits (the last split of the job before); the two warn as one cache, if at all."""
        transform, raw_fingerprint = self.dataset.transform, self.dataset.source.fingerprint
        room, records = most - 2 * self.index, cache_bytes - 2 * self.index
        share = {"raw": 0, "prepared": records, "mixed": choice.prepared_room}[choice.form]
        fingerprint = prepared_fingerprint(raw_fingerprint, transform.identity)
        prepared = self._store(fingerprint, self.index + room, limit=share)
        raw = self._store(raw_fingerprint, self.index + room, limit=records - prepared.limit)
        held = prepared.limit + raw.limit
        if self.warn_capacity and held != records:
            warnings.warn(
                f"the cache in {self.cache_dir} already held this data with {held + 2 * self.index} bytes "
                f"(prepared and raw records); using it as it is (cache_bytes={cache_bytes} applies only to a "
                "new cache)",
                RuntimeWarning,
                stacklevel=4,
            )
        return SourceCache(raw=raw, prepared=PreparedRecords(prepared, transform, raw))

    def _store(self, fingerprint: str, capacity: int, limit: int | None = None) -> MinIOCache:
        store = MinIOCache.open(
            fingerprint=fingerprint,
            num_records=len(self.dataset),
            capacity=capacity,
            cache_dir=self.cache_dir,
            warn_capacity=self.warn_capacity and limit is None,
            limit=limit,
        )
        self.stores.append(store)
        return store

    def close(self) -> None:
        for store in self.stores:
            store.close()


def _records_bytes(dataset: SourceDataset, choice: FormChoice) -> int:
    """What the records take in the chosen form: the source's bytes raw; the measured size of a prepared
    record times the records, with 10% to spare (sizes vary), prepared; all the room there is, mixed (a mix
    is chosen only where memory binds)."""
    if choice.form == "prepared":
        return int(choice.prepared_bytes * len(dataset) * 1.1)
    records: Any = dataset.source.nbytes if choice.form == "raw" else None
    return records if records is not None else _ALL_MEMORY
