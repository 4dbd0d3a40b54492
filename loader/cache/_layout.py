"""On-disk layout of a MinIO store: a header + one slot per record in ``index``, payloads packed in ``data``.

``index`` (mmap'ed by every process that uses the store)::

    header (4096 bytes): magic, version, capacity, num_records, data_capacity, used, full, fingerprint,
                         limit, given_back, records_given_back, own_at_give_back, limit_at_give_back
    slots  (40 bytes each, one per record): offset u64, length u32, state u32, checksum u64,
                                            writer u32, generation u32, identity u64

A slot is EMPTY, RESERVED (space taken by a writer, payload not yet complete), READY or UNHIT (ready, and not
read from the store yet since a read that left its pages in the page cache admitted it: its first hit
evicts them, ``MinIOCache.first_hit``); READY and UNHIT are held. A writer reserves under the store's lock
(naming itself in ``writer`` and ``generation``), writes the payload with ``pwrite`` and its checksum, and
only then flips the slot to READY (or UNHIT) with one aligned 4-byte store, so a reader never sees a torn
record. A writer killed mid-insert leaves a RESERVED slot that no reader uses, and the next writer of that
record takes it over once the kernel says its writer is gone. ``data`` holds payloads back to back: the
memory used is the bytes admitted, not pages per record. The checksum (xxh3-64 of the payload, seeded with
the record's index) is checked on every read, so neither damaged bytes nor a slot moved to another record's
place is ever served. ``identity`` is what the source said of the record before it was read to be admitted (a
file's size and mtime folded to 64 bits; 0 for a source whose records cannot change): a process serves a
record only once its source said the same (``MinIOCache.get``: asked once per record in each process), so a
file rewritten since it was admitted is read from storage, and admitted again in new space. ``limit`` is how
much of ``data_capacity`` the store may fill now: a cache of two stores (raw and prepared records) moves room
from one to the other by moving their limits (``MinIOCache.set_limit``), without touching their files.
``given_back`` and ``records_given_back`` count what the store gave back because the job grew into the memory
the cache keeps free (``_giveback.py``), and the two fields after them what the job's own memory and its limit
were the last time, so that every process's ``stats()`` can say how much went and why.
"""

from __future__ import annotations

import numpy as np
import xxhash

__all__ = [
    "EMPTY",
    "HEADER_BYTES",
    "HEADER_DTYPE",
    "MAGIC",
    "READY",
    "RESERVED",
    "SLOT_DTYPE",
    "UNHIT",
    "VERSION",
    "checksum",
    "index_bytes",
]

MAGIC = b"SBMINIO1"
VERSION = 6
HEADER_BYTES = 4096
EMPTY, RESERVED, READY, UNHIT = 0, 1, 2, 3

HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("pad", "<u4"),
        ("capacity", "<u8"),
        ("num_records", "<u8"),
        ("data_capacity", "<u8"),
        ("used", "<u8"),
        ("full", "<u4"),
        ("pad2", "<u4"),
        ("fingerprint", "S64"),
        ("limit", "<u8"),
        ("given_back", "<u8"),
        ("records_given_back", "<u8"),
        ("own_at_give_back", "<u8"),
        ("limit_at_give_back", "<u8"),
    ]
)
SLOT_DTYPE = np.dtype(
    [
        ("offset", "<u8"),
        ("length", "<u4"),
        ("state", "<u4"),
        ("checksum", "<u8"),
        ("writer", "<u4"),
        ("generation", "<u4"),
        ("identity", "<u8"),
    ]
)


def index_bytes(num_records: int) -> int:
    """Bytes the index file takes for ``num_records`` records (counted against the capacity)."""
    return HEADER_BYTES + SLOT_DTYPE.itemsize * num_records


def checksum(index: int, payload: bytes) -> int:
    """The record's checksum: xxh3-64 of its bytes, seeded with its index (~2 us per 100 KB)."""
    return xxhash.xxh3_64_intdigest(payload, seed=index)
