"""On-disk layout of a MinIO store: a header + one slot per record in ``index``, payloads packed in ``data``.

``index`` (mmap'ed by every process that uses the store)::

    header (4096 bytes): magic, version, capacity, num_records, data_capacity, used, full, fingerprint
    slots  (16 bytes each, one per record): offset u64, length u32, state u32

A slot is EMPTY, RESERVED (space taken by a writer, payload not yet complete) or READY. A writer
reserves under the store's lock, writes the payload with ``pwrite``, and only then flips the slot to
READY with one aligned 4-byte store, so a reader never sees a torn record and a writer killed
mid-insert leaves a RESERVED slot that no reader uses. ``data`` holds payloads back to back: the
memory used is the bytes admitted, not pages per record.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "EMPTY",
    "HEADER_BYTES",
    "HEADER_DTYPE",
    "MAGIC",
    "READY",
    "RESERVED",
    "SLOT_DTYPE",
    "VERSION",
    "index_bytes",
]

MAGIC = b"SBMINIO1"
VERSION = 1
HEADER_BYTES = 4096
EMPTY, RESERVED, READY = 0, 1, 2

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
    ]
)
SLOT_DTYPE = np.dtype([("offset", "<u8"), ("length", "<u4"), ("state", "<u4")])


def index_bytes(num_records: int) -> int:
    """Bytes the index file takes for ``num_records`` records (counted against the capacity)."""
    return HEADER_BYTES + SLOT_DTYPE.itemsize * num_records
