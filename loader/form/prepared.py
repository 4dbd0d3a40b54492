"""Records held prepared: the output of a staged transform's ``prepare`` (``loader.fetching.staged``), in a
store of its own in place of the raw one, so a hit costs only ``augment``.

The store is a MinIO store like the raw one (private, checksummed, never evicting, shared by workers and
jobs); its fingerprint is the source's and the preparation's identity together, so a job with another
preparation never reads these records, and the next run with the same one starts warm.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from loader.cache import CorruptRecordError, MinIOCache
from loader.fetching.fetched import Fetched
from loader.fetching.staged import StagedTransform, decode_prepared, encode_prepared

__all__ = ["PreparedRecords", "prepared_fingerprint"]


def prepared_fingerprint(source_fingerprint: str, identity: str) -> str:
    """The prepared store's key: the data's fingerprint and what its preparation depends on."""
    return hashlib.sha256(f"{source_fingerprint}\0prepared\0{identity}".encode()).hexdigest()


class PreparedRecords:
    """A dataset's prepared records: ``fetch`` one from the store, ``make`` a sample from a fetch."""

    def __init__(self, store: MinIOCache, transform: StagedTransform, raw: MinIOCache | None = None) -> None:
        self.store, self.transform = store, transform
        self.raw = raw  # a mix of forms: the raw store takes what the prepared store has no room for

    def fetch(self, index: int, identity: Callable[[int], int] | None) -> Fetched | None:
        """The record prepared, as stored (a hit, while ``identity(index)`` says what it said when it was
        prepared), or None: a miss, or a stored copy that failed its check (``corrupt``: the caller reads the
        raw record and prepares it again)."""
        start = time.perf_counter()
        try:
            stored = self.store.get(index, identity, mutable=True)  # its arrays become the sample's: no copy
        except CorruptRecordError:
            return Fetched(b"", False, False, time.perf_counter() - start, corrupt=True)
        if stored is None:
            return None
        return Fetched(stored, True, False, time.perf_counter() - start, prepared=True)

    def make(self, index: int, got: Fetched) -> tuple[Any, bool, str]:
        """(the sample, whether the record was admitted, how it was made: the ``stats()`` field that counts
        it, ``samples_from_prepared``, ``samples_prepared`` or ``samples_whole``): from the stored record on a
        hit; else prepared from the raw bytes, offered to the store, then augmented. A record held raw (a hit,
        or admitted raw as it was read: the room may have moved to the prepared store since,
        ``loader.form.revisit``), or one the prepared store has no room for, gets the whole transform on its
        raw bytes (cheaper than its two stages apart, as the uncached path runs it): no record is held in both
        forms. In a mix, a record read from the source that has no room prepared goes to the raw store. Raises
        ValueError or OSError for a record that cannot be prepared."""
        transform = self.transform
        if got.prepared:
            return transform.augment(decode_prepared(got.raw, own=True)), False, "samples_from_prepared"
        if got.hit or got.admitted or not self.store.accepting(index):
            return transform(got.raw), self._admit_raw(index, got), "samples_whole"
        prepared, sample = transform.prepare_augment(got.raw)
        admitted = self.store.admit(index, encode_prepared(prepared), identity=got.identity)
        admitted = admitted or self._admit_raw(index, got)
        return sample, admitted, "samples_prepared"

    def _admit_raw(self, index: int, got: Fetched) -> bool:
        """A mix of forms: a record read from the source that has no room prepared goes to the raw store."""
        raw = self.raw
        if raw is None or got.hit or got.admitted or got.corrupt:
            return False
        return raw.accepting(index) and raw.admit(index, got.raw, identity=got.identity)
