"""Keep storage reads out of the OS page cache, and measure what a file has resident (Linux).

All sources use these helpers when ``drop_page_cache`` is true:

* a file read whole (image folder): ``read_file(path, drop=True)`` fadvises DONTNEED before closing;
* a value copied out of a memory map (LMDB, Arrow IPC): ``MappedFile(path).drop(address, length)`` unmaps
  the value's pages from this process (madvise DONTNEED) and then evicts them (fadvise DONTNEED), because the
  kernel keeps pages that any process still maps;
* a file read through a library's own buffered reads (Parquet): ``drop_file(fd)``.

Ranges are widened to whole pages: fadvise alone rounds partial pages inward and would keep them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref

from loader._libc import libc as _libc

__all__ = ["PAGE", "MappedFile", "drop_file", "prefetch", "read_file"]

PAGE = mmap.PAGESIZE


def read_file(path: str, drop: bool) -> bytes:
    """The whole file; with ``drop`` its pages are evicted from the page cache before the file is closed."""
    with open(path, "rb", buffering=0) as f:
        data = f.readall()
        if drop:
            drop_file(f.fileno())
    return data


def drop_file(fd: int, offset: int = 0, length: int = 0) -> None:
    """Evict the file's unmapped, clean pages in ``[offset, offset + length)`` (length 0: to the end)."""
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def prefetch(address: int, length: int) -> None:
    """Read a mapped multi-page range in one request (under MADV_RANDOM each fault would read one page)."""
    if length > PAGE:
        start = address - address % PAGE
        _libc.madvise(start, address + length - start, mmap.MADV_WILLNEED)


class MappedFile:
    """Drops the pages of one file that this process reads through a memory map (LMDB, Arrow IPC)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self.fd)
        self.inode = os.fstat(self.fd).st_ino
        self._maps: list[tuple[int, int, int]] = []

    def drop(self, address: int, length: int) -> None:
        """Unmap and evict the pages holding ``[address, address + length)`` of a mapping of this file."""
        start = address - address % PAGE
        end = -(-(address + length) // PAGE) * PAGE
        offset = self._file_offset(start)
        if offset is None:  # not inside a mapping of the file (a decompressed copy): evict what is unmapped
            drop_file(self.fd)
            return
        if _libc.madvise(start, end - start, mmap.MADV_DONTNEED) != 0:
            raise OSError(ctypes.get_errno(), f"madvise failed on a mapping of {self.path}")
        drop_file(self.fd, offset, end - start)

    def _file_offset(self, address: int) -> int | None:
        for lo, hi, offset in self._maps:
            if lo <= address < hi:
                return offset + address - lo
        found = _mapping_at(address, self.path, self.inode)
        if found is None:
            return None
        self._maps.append(found)
        return found[2] + address - found[0]


def _mapping_at(address: int, path: str, inode: int) -> tuple[int, int, int] | None:
    """(start, end, file offset) of the mapping holding ``address`` if it maps the file (path or inode)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.rstrip("\n").split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                ours = len(fields) == 6 and (fields[5] == path or int(fields[4]) == inode)
                return (lo, hi, int(fields[2], 16)) if ours else None
    return None
