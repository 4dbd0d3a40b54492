"""The data on storage: its size as the device reads it, what of it the page cache holds, and a cold or warm
page cache on demand. The limits a run asks the kernel for are ``stallbench.conditions.limits``; sizes are
read and written in ``stallbench.conditions.sizes``.

Units: the kernel reads files in whole pages, so reading a file costs the device its size rounded up to a page
(``device_bytes``). Every storage figure stallbench reports (a dataset's size, bytes read per epoch, storage
bandwidth) is in these device bytes; the records' own bytes are shown beside them (``data_size``).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PAGE",
    "DataSize",
    "data_size",
    "dataset_size",
    "device_bytes",
    "evict_page_cache",
    "files_in",
    "in_object_storage",
    "resident_bytes",
    "warm_page_cache",
]

PathArg = str | os.PathLike
PAGE = mmap.PAGESIZE


def files_in(paths: PathArg | Iterable[PathArg]) -> Iterator[str]:
    """Every regular file in ``paths``, walking directories."""
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        if os.path.isdir(path):
            for parent, _, names in os.walk(path):
                yield from (os.path.join(parent, n) for n in sorted(names))
        elif os.path.isfile(path):
            yield os.fspath(path)
        else:
            raise FileNotFoundError(f"no such file or directory: {os.fspath(path)!r}")


def device_bytes(size: int) -> int:
    """Bytes the kernel reads from the device for a file of ``size`` bytes read whole: whole pages."""
    return -(-size // PAGE) * PAGE


def in_object_storage(data: object) -> bool:
    """Whether ``data`` names objects in an S3-compatible store (``s3://bucket/prefix``), read over the
    network: no local file, no page cache, no disk throttle (``loader.sources`` tells)."""
    from loader.sources import in_object_storage

    return in_object_storage(data)


@dataclass(frozen=True)
class DataSize:
    """A dataset's size in the two units: what reading all of it costs the device, and its files' bytes."""

    device_bytes: int  # each file rounded up to whole pages (the unit of every storage figure)
    record_bytes: int  # the files' sizes summed


def dataset_size(data: PathArg) -> DataSize:
    """The size of the dataset at ``data`` (a file, or a folder walked) as a job reads it: hidden files and
    folders (a name starting with ``.``) left out, since no source reads them (a generated workload keeps its
    manifest in one); for a generated workload and a user's command alike."""
    root = Path(data)
    if root.is_file():
        return data_size([root])
    files = [p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root))]
    if not files:
        raise ValueError(f"--data {root} holds no file")
    return data_size(files)


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def data_size(paths: PathArg | Iterable[PathArg]) -> DataSize:
    """The size of every file in ``paths`` (directories walked), in device bytes and in record bytes."""
    sizes = [os.path.getsize(path) for path in files_in(paths)]
    return DataSize(device_bytes=sum(map(device_bytes, sizes)), record_bytes=sum(sizes))


def _resident_fd(fd: int, size: int, whole_pages: bool = False) -> int:
    """Bytes of open file ``fd`` in the page cache (``cachestat``, else ``mincore`` on a mapping that touches
    no page), 0 where it cannot be told; with ``whole_pages`` the pages' whole size, a partial last page
    counted whole. The kernel tells the truth only to the file's owner or a writer: the callers check, so
    this asks the kernel itself, never through the loader's own choice of what to trust
    (``loader.system.pagecache.resident_count``), which it witnesses."""
    from loader.system.libc import cached_pages  # here: the command line starts without torch
    from loader.system.pagecache import file_residency

    pages = cached_pages(fd, 0, size)
    if pages is None:
        mapped = file_residency(fd, size)
        pages = 0 if mapped is None else int(mapped.sum())
    resident = pages * mmap.PAGESIZE
    return resident if whole_pages else min(resident, size)


def resident_bytes(paths: PathArg | Iterable[PathArg], *, whole_pages: bool = False) -> int:
    """Bytes of these files (directories walked) that are now in the OS page cache; with ``whole_pages``,
    the memory they take there (each resident page whole, a file's last page included).

    The kernel tells this only to root, the file's owner or a process that may write it (it claims every
    page resident to anyone else), so other files raise PermissionError.
    """
    total = 0
    for path in files_in(paths):
        fd = os.open(path, os.O_RDONLY)
        try:
            writer = os.access(path, os.W_OK, effective_ids=True)
            if not writer and os.geteuid() not in (0, os.fstat(fd).st_uid):
                raise PermissionError(f"mincore reports the page cache only to the owner or a writer: {path}")
            total += _resident_fd(fd, os.fstat(fd).st_size, whole_pages)
        finally:
            os.close(fd)
    return total


def evict_page_cache(paths: PathArg | Iterable[PathArg]) -> int:
    """Drop these files (directories walked) from the page cache; returns the bytes of the files advised.

    Clean pages go at once; a file with pages left (dirty ones survive the advice) is written back and advised
    again. Needs no privilege. Pages of memory-only filesystems (tmpfs) and pages mapped by a process stay.
    """
    from loader.system.pagecache import evict_written_back  # here: the command line starts without loader

    return sum(evict_written_back(path) for path in files_in(paths))


def warm_page_cache(paths: PathArg | Iterable[PathArg]) -> None:
    """Read every file of ``paths`` (directories walked) once, so that a run finds them in the page cache."""
    for path in files_in(paths):
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
