"""The pages of a file read through a memory map (Arrow IPC): what was resident before a copy; unmapping an
admitted record's pages from this process, and evicting them at its first hit from the store (see
``loader.system.pagecache``)."""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref

from loader.system.libc import libc as _libc
from loader.system.pagecache import PAGE, can_tell, drop_file, mincore

__all__ = ["MappedFile"]


class MappedFile:
    """The pages of one file that this process reads through a memory map (Arrow IPC).

    What was resident before a read is asked of ``mincore`` on the mapping: a read that faults pages in must
    not read ahead as a probe would. The kernel answers ``mincore`` truthfully only to the file's owner or a
    writer (others see just their own mapped pages), so for anyone else no read is known to be ours.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self.fd)
        st = os.fstat(self.fd)
        self.inode = st.st_ino
        self.can_tell = can_tell(self.fd)
        self._maps: list[tuple[int, int, int]] = []

    def cold_inside(self, address: int, length: int) -> bool:
        """Whether none of the pages wholly inside ``[address, address + length)`` is resident now, so that a
        read of the range brings them all in; False where there are none or the kernel will not tell. (The
        pages at either end are most often shared with a neighbouring value: never counted as ours.)"""
        start, end = self._inner(address, length)
        if not self.can_tell or end <= start or self.file_offset(start) is None:
            return False
        return not mincore(start, end - start, self.path).any()

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

    def unmap(self, address: int, length: int) -> None:
        """Unmap from this process the pages wholly inside ``[address, address + length)`` of a mapping of
        this file; they stay in the page cache, for the kernel to reclaim as any page read once."""
        start, end = self._inner(address, length)
        if end <= start:
            return
        if _libc.madvise(start, end - start, mmap.MADV_DONTNEED) != 0:
            raise OSError(ctypes.get_errno(), f"madvise failed on a mapping of {self.path}")

    def evict(self, address: int, length: int) -> None:
        """Evict from the page cache the file's pages wholly inside ``[address, address + length)`` of a
        mapping of it (those no process maps)."""
        start, end = self._inner(address, length)
        if end > start:
            drop_file(self.fd, self._offset(start), end - start)

    @staticmethod
    def _inner(address: int, length: int) -> tuple[int, int]:
        """The pages wholly inside ``[address, address + length)``: (start, end) addresses."""
        return -(-address // PAGE) * PAGE, (address + length) // PAGE * PAGE

    def _offset(self, address: int) -> int:
        offset = self.file_offset(address)
        if offset is None:
            raise ValueError(f"address {address:#x} is not in a mapping of {self.path}")
        return offset


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
