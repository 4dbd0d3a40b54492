"""C library calls that Python's ``os`` and ``mmap`` modules do not offer: a raw mmap, madvise, mincore,
fallocate's hole punching (``punch_hole``), the ``cachestat`` system call (``cached_pages``), and glibc's
heap trim (``trim_heap``)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

__all__ = ["MAP_FAILED", "cached_pages", "libc", "punch_hole", "trim_heap"]

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
libc.syscall.restype = ctypes.c_long
MAP_FAILED = ctypes.c_void_p(-1).value
_PUNCH_HOLE = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
_SYS_CACHESTAT = 451  # the same number on every architecture (added after their tables were unified)


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


_cachestat_missing = False  # this kernel has no cachestat (before Linux 6.5): not asked again


def cached_pages(fd: int, offset: int, length: int) -> int | None:
    """Pages of ``[offset, offset + length)`` of open file ``fd`` in the page cache now, in one system call
    (``cachestat``, Linux 6.5); None where the kernel cannot or will not say (older, or a file this process
    may not write: newer kernels refuse as ``mincore`` would lie). Reads nothing, maps nothing."""
    global _cachestat_missing
    if _cachestat_missing or length <= 0:
        return None
    asked, stats = _CachestatRange(offset, length), _Cachestat()
    if libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(asked), ctypes.byref(stats), 0):
        _cachestat_missing = ctypes.get_errno() == errno.ENOSYS
        return None
    return stats.nr_cache


def punch_hole(fd: int, start: int, end: int) -> None:
    """Free the file's pages from ``start`` to ``end`` (whole pages within them; tmpfs gives the memory back
    at once); the file keeps its size, and the range reads as zeros. Raises OSError where it cannot."""
    page = mmap.PAGESIZE
    first, last = -(-start // page) * page, -(-end // page) * page
    if last > first and libc.fallocate(fd, _PUNCH_HOLE, first, last - first) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def trim_heap() -> None:
    """Give the C heap's free pages back to the kernel: glibc's ``malloc_trim(0)``, which frees the whole
    free pages of every arena, in the middle of a heap too (``free`` gives back only the top of one, past a
    threshold). A no-op where the C library has no such call (musl, macOS)."""
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(ctypes.c_size_t(0))
