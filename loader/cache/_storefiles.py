"""Creating a store's files whole: built in a private temporary folder, then renamed into place at once."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import numpy as np

from loader.cache._layout import HEADER_DTYPE, MAGIC, VERSION, index_bytes

__all__ = ["create_store"]


def create_store(path: Path, *, fingerprint: str, num_records: int, capacity: int) -> None:
    """Make the store at ``path`` (in a private folder) unless another process makes it first."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o700)
    try:
        _write_index(tmp / "index", fingerprint, num_records, capacity)
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


def _write_index(file: Path, fingerprint: str, num_records: int, capacity: int) -> None:
    size = index_bytes(num_records)
    _make_file(file, size, allocate=True)
    with open(file, "r+b") as f:
        header = np.zeros(1, HEADER_DTYPE)
        header["magic"], header["version"] = MAGIC, VERSION
        header["capacity"], header["num_records"] = capacity, num_records
        header["data_capacity"] = capacity - size
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
