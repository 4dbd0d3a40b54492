"""Give back to the kernel the page-cache pages of a record that the loader's own cache now holds (Linux).

The loader's cache holds the records it admitted; the page cache should not hold them a second time. But
only those: a record the cache did not admit keeps its pages, so spare memory serves it as it would serve
torch's loader, and pages that were resident before our read (another job's warm pages) are never evicted.

What was resident before a read is asked of ``mincore``, which reads nothing (``resident_pages``: a fresh
mapping of the file, never touched). The kernel answers it truthfully only to the file's owner or a writer;
for anyone else a ``preadv2(RWF_NOWAIT)`` copies what the page cache holds up to the first page it does not
(``resident_prefix``). That probe is the second choice: it starts reading ahead the pages it misses, and on
a fast device some of them arrive before it stops, so they look resident and stay cached twice. The pages
not resident before the read were brought in by it, and are evicted once the record is admitted:

* a file read whole (image folder): ``posix_fadvise(DONTNEED)`` on those pages before the file is closed;
* a value copied out of a memory map (Arrow IPC): residency comes from ``mincore`` on the mapping before the
  copy (a probing read would read ahead into other records), and ``MappedFile.drop_cold`` (``_mapped.py``)
  unmaps the pages that were not resident from this process (madvise DONTNEED) and then evicts them
  (fadvise DONTNEED), because the kernel keeps mapped pages.

Where residency cannot be learned (a filesystem without ``RWF_NOWAIT``; ``mincore`` on a file this user
neither owns nor may write) nothing is evicted unless it is known to be ours. Ranges are widened to whole
pages at their end (fadvise rounds partial pages inward).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from collections.abc import Callable, Iterator

import numpy as np

from loader.system.libc import MAP_FAILED
from loader.system.libc import libc as _libc

__all__ = [
    "PAGE",
    "can_tell",
    "cold_runs",
    "drop_file",
    "file_residency",
    "mincore",
    "prefetch",
    "read_admitting",
    "resident_pages",
    "resident_prefix",
]

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


def can_tell(fd: int) -> bool:
    """Whether ``mincore`` tells this process the truth about the file's pages: it owns or may write it."""
    owner = os.fstat(fd).st_uid
    return os.geteuid() in (0, owner) or os.access(f"/proc/self/fd/{fd}", os.W_OK)


def resident_pages(fd: int, size: int) -> np.ndarray | None:
    """Per page of the file's first ``size`` bytes: resident now, read from a fresh mapping that touches
    nothing; None where the kernel would not tell the truth (``can_tell``) or the file is empty."""
    if size == 0 or not can_tell(fd):
        return None
    return file_residency(fd, size)


def file_residency(fd: int, size: int) -> np.ndarray | None:
    """Per page of the file's first ``size`` bytes: resident now, from a fresh mapping that touches nothing;
    None where it cannot be mapped. The caller knows the kernel tells it the truth (``can_tell``)."""
    if size == 0:
        return None
    span = -(-size // PAGE) * PAGE
    address = _libc.mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address in (None, MAP_FAILED):
        return None
    try:
        return mincore(address, span, path=f"descriptor {fd}")
    except OSError:
        return None
    finally:
        _libc.munmap(address, span)


def mincore(address: int, span: int, path: str) -> np.ndarray:
    """Per page of the mapped range ``[address, address + span)`` (``address`` on a page boundary): resident
    now. OSError, naming the mapping of ``path``, where the kernel refuses."""
    vec = (ctypes.c_ubyte * -(-span // PAGE))()
    if _libc.mincore(address, span, vec) != 0:
        raise OSError(ctypes.get_errno(), f"mincore failed on a mapping of {path}")
    return np.frombuffer(vec, np.uint8) & 1 == 1


def cold_runs(was_resident: np.ndarray) -> Iterator[tuple[int, int]]:
    """(first page, pages) of each run of pages that were not resident."""
    cold = np.flatnonzero(~was_resident)
    for run in np.split(cold, np.flatnonzero(np.diff(cold) != 1) + 1) if cold.size else ():
        yield int(run[0]), len(run)


def drop_pages(fd: int, was_resident: np.ndarray) -> None:
    """Evict the file's pages that were not resident (``resident_pages`` before the read), run by run."""
    for first, pages in cold_runs(was_resident):
        drop_file(fd, first * PAGE, pages * PAGE)


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
        before = resident_pages(fd, size)
        if before is not None:
            raw = f.readall()
            admitted = admit(raw)
            if admitted and not before.all():
                drop_pages(fd, before)
            return raw, admitted
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
