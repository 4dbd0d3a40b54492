"""The pages of a file read through a memory map (Arrow IPC): what was resident before a copy, and evicting
the rest once the record is admitted (see ``loader.system.pagecache``)."""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref

import numpy as np

from loader.system.libc import libc as _libc
from loader.system.pagecache import PAGE, can_tell, cold_runs, drop_file, mincore

__all__ = ["MappedFile"]


class MappedFile:
    """Evicts the pages of one file that this process read through a memory map (Arrow IPC).

    What was resident before a read is asked of ``mincore`` on the mapping: a read that faults pages in must
    not read ahead as a probe would. The kernel answers ``mincore`` truthfully only to the file's owner or a
    writer (others see just their own mapped pages), so for anyone else nothing is evicted.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self.fd)
        st = os.fstat(self.fd)
        self.inode = st.st_ino
        self.can_tell = can_tell(self.fd)
        self._maps: list[tuple[int, int, int]] = []

    def resident(self, address: int, length: int) -> np.ndarray | None:
        """Per page of ``[address, address + length)``: resident now; None where the kernel will not tell."""
        if not self.can_tell or length == 0 or self.file_offset(address) is None:
            return None
        start = address - address % PAGE
        span = address + length - start
        return mincore(start, span, self.path)

    def drop_cold(self, address: int, was_resident: np.ndarray) -> None:
        """Evict the pages from ``address`` on that were not resident before the read (``resident``)."""
        start = address - address % PAGE
        for first, pages in cold_runs(was_resident):
            self.drop(start + first * PAGE, pages * PAGE)

    def file_offset(self, address: int) -> int | None:
        """Where a mapped address of this file lies in the file; None if it is not in a mapping of it."""
        for lo, hi, offset in self._maps:
            if lo <= address < hi:
                return offset + address - lo
        found = _mapping_at(address, self.path, self.inode)
        if found is None:
            return None
        self._maps.append(found)
        return found[2] + address - found[0]

    def drop(self, address: int, length: int) -> None:
        """Unmap and evict the pages holding ``[address, address + length)`` of a mapping of this file."""
        start = address - address % PAGE
        end = -(-(address + length) // PAGE) * PAGE
        offset = self.file_offset(start)
        if offset is None:
            raise ValueError(f"address {address:#x} is not in a mapping of {self.path}")
        if _libc.madvise(start, end - start, mmap.MADV_DONTNEED) != 0:
            raise OSError(ctypes.get_errno(), f"madvise failed on a mapping of {self.path}")
        drop_file(self.fd, offset, end - start)


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
