"""A store's files: created whole (built in a private temporary folder, then renamed into place at once), and
checked when attached: a header of another version or other data is never used."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import numpy as np

from loader.cache._layout import HEADER_DTYPE, MAGIC, VERSION, index_bytes

__all__ = ["StoreDamaged", "check_capacity", "check_header", "create_store"]


class StoreDamaged(ValueError):
    """The store's own files are not a whole store of this version: it is rebuilt."""


def create_store(
    path: Path, *, fingerprint: str, num_records: int, capacity: int, limit: int | None = None
) -> None:
    """Make the store at ``path`` (in a private folder) unless another process makes it first; it may fill
    ``limit`` bytes of its data (None: all of it)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o700)
    try:
        _write_index(tmp / "index", fingerprint, num_records, capacity, limit)
        _make_file(tmp / "data", capacity - index_bytes(num_records), allocate=False)
        _make_file(tmp / "lock", 0, allocate=False)
        _make_file(tmp / "writers", 0, allocate=False)
        try:
            os.rename(tmp, path)
        except OSError:
            if not path.is_dir():  # lost no race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_index(file: Path, fingerprint: str, num_records: int, capacity: int, limit: int | None) -> None:
    size = index_bytes(num_records)
    data = capacity - size
    _make_file(file, size, allocate=True)
    with open(file, "r+b") as f:
        header = np.zeros(1, HEADER_DTYPE)
        header["magic"], header["version"] = MAGIC, VERSION
        header["capacity"], header["num_records"] = capacity, num_records
        header["data_capacity"] = data
        header["limit"] = data if limit is None else max(0, min(limit, data))
        header["full"] = header["limit"] == 0
        header["fingerprint"] = fingerprint[:64].encode()
        f.write(header.tobytes())


def _make_file(file: Path, size: int, *, allocate: bool) -> None:
    """A new 0600 file of ``size`` bytes; ``allocate`` reserves memory now, so a full /dev/shm fails here."""
    fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if allocate and size:
            os.posix_fallocate(fd, 0, size)
        else:
            os.ftruncate(fd, size)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def check_capacity(capacity: int, num_records: int) -> None:
    """ValueError naming ``cache_bytes`` unless it is a size that holds more than the index."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"cache_bytes must be a positive number of bytes, got {capacity!r}")
    if capacity <= index_bytes(num_records):
        raise ValueError(
            f"cache_bytes={capacity} cannot hold even the index of {num_records} records "
            f"({index_bytes(num_records)} bytes); give it more"
        )


def check_header(header: np.ndarray, path: Path, fingerprint: str, num_records: int) -> None:
    """StoreDamaged for a header of another version, data or record count (the fingerprint covers the
    records, so a count that differs under it is damage: the store is made anew)."""
    if header["magic"][0] != MAGIC or header["version"][0] != VERSION:
        raise StoreDamaged(f"{path} is not a stallbench cache of version {VERSION}")
    if header["fingerprint"][0].decode(errors="replace") != fingerprint[:64]:
        raise StoreDamaged(f"the header of {path} names other data")
    if header["num_records"][0] != num_records:
        counted = int(header["num_records"][0])
        raise StoreDamaged(f"the header of {path} counts {counted} records where its data has {num_records}")
