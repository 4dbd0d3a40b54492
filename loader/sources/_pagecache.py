"""Give back to the kernel the page-cache pages of a record that the loader's own cache now holds (Linux).

The loader's cache holds the records it admitted; the page cache should not hold them a second time. But
only those: a record the cache did not admit keeps its pages, so spare memory serves it as it would serve
torch's loader, and pages that were resident before our read (another job's warm pages) are never evicted.

What was resident before a read is learned without privileges: a ``preadv2(RWF_NOWAIT)`` copies only what
the page cache holds and stops at the first page it does not (``resident_prefix``). The pages from there on
were brought in by our read, and are evicted once the record is admitted:

* a file read whole (image folder): ``posix_fadvise(DONTNEED)`` on that range before the file is closed;
* a value copied out of a memory map (Arrow IPC): residency comes from ``mincore`` on the mapping before the
  copy (a probing read would read ahead into other records), and ``MappedFile.drop_cold`` unmaps the pages
  that were not resident from this process (madvise DONTNEED) and then evicts them (fadvise DONTNEED),
  because the kernel keeps mapped pages.

Where residency cannot be learned (a filesystem without ``RWF_NOWAIT``; ``mincore`` on a file this user
neither owns nor may write) nothing is evicted unless it is known to be ours. Ranges are widened to whole
pages at their end (fadvise rounds partial pages inward).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import weakref
from collections.abc import Callable

import numpy as np

from loader._libc import libc as _libc

__all__ = ["PAGE", "MappedFile", "drop_file", "prefetch", "read_admitting", "resident_prefix"]

PAGE = mmap.PAGESIZE
_CANNOT_TELL = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def resident_prefix(fd: int, offset: int, length: int) -> bytearray | None:
    """The bytes of ``[offset, offset + length)`` that the page cache holds, up to the first page it does
    not (possibly none); None when the filesystem cannot tell (no ``RWF_NOWAIT``)."""
    buf = bytearray(length)
    try:
        got = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
    except BlockingIOError:
        got = 0
    except OSError as exc:
        if exc.errno in _CANNOT_TELL:
            return None
        raise
    del buf[got:]
    return buf


def _cold_start(offset: int, resident: int) -> int:
    """The file offset of the first page our read brought in, after ``resident`` bytes found resident at
    ``offset``: a page holding any resident byte is never counted as ours."""
    first = offset + resident
    return first - first % PAGE if resident == 0 else -(-first // PAGE) * PAGE


def read_admitting(path: str, admit: Callable[[bytes], bool]) -> tuple[bytes, bool]:
    """Read a whole file, offer it to ``admit(raw) -> bool``; when admitted, evict the pages this read
    brought into the page cache (none that were resident before it)."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        head = resident_prefix(fd, 0, size)
        if head is None:  # this filesystem cannot tell what was resident: read, admit, evict nothing
            raw = f.readall()
            return raw, admit(raw)
        raw = bytes(head) + os.pread(fd, size - len(head), len(head)) if len(head) < size else bytes(head)
        admitted = admit(raw)
        if admitted and len(head) < size:
            drop_file(fd, _cold_start(0, len(head)))
    return raw, admitted


def drop_file(fd: int, offset: int = 0, length: int = 0) -> None:
    """Evict the file's unmapped, clean pages in ``[offset, offset + length)`` (length 0: to the end)."""
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def prefetch(address: int, length: int) -> None:
    """Read a mapped multi-page range in one request (under MADV_RANDOM each fault would read one page)."""
    if length > PAGE:
        start = address - address % PAGE
        _libc.madvise(start, address + length - start, mmap.MADV_WILLNEED)


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
        self.can_tell = st.st_uid == os.geteuid() or os.geteuid() == 0 or os.access(self.path, os.W_OK)
        self._maps: list[tuple[int, int, int]] = []

    def resident(self, address: int, length: int) -> np.ndarray | None:
        """Per page of ``[address, address + length)``: resident now; None where the kernel will not tell."""
        if not self.can_tell or length == 0 or self.file_offset(address) is None:
            return None
        start = address - address % PAGE
        span = address + length - start
        vec = (ctypes.c_ubyte * -(-span // PAGE))()
        if _libc.mincore(start, span, vec) != 0:
            raise OSError(ctypes.get_errno(), f"mincore failed on a mapping of {self.path}")
        return np.frombuffer(vec, np.uint8) & 1 == 1

    def drop_cold(self, address: int, was_resident: np.ndarray) -> None:
        """Evict the pages from ``address`` on that were not resident before the read (``resident``)."""
        start = address - address % PAGE
        cold = np.flatnonzero(~was_resident)
        for run in np.split(cold, np.flatnonzero(np.diff(cold) != 1) + 1) if cold.size else ():
            self.drop(start + int(run[0]) * PAGE, len(run) * PAGE)

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
