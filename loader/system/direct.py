"""Reads around the page cache (``O_DIRECT``), in the device's own blocks: for a file the store is about to
hold, which the page cache would otherwise hold a second time, in whole pages.

A buffered read takes a file from the device in whole pages (4 KiB): a 3.6 KB JPEG costs 4 KiB of the
storage's bandwidth and 4 KiB of page cache, evicted later at the record's first hit from the store. A
direct read takes it in the device's logical blocks (512 bytes on most disks) straight into our buffer:
bench_tight_budget's 12,520 files are 44.7 MB, 51.3 MB in pages, 47.6 MB in 512-byte blocks, so a
first epoch that reads them all at the storage's pace takes 7% less time, and leaves the page cache alone.
Files of more than 1 MiB are read as usual: a block saves them under 0.4%, and the aligned buffer, copied
out, would hold such a file twice for a moment. Written by hand: Python's ``os`` offers the flag but no
aligned buffer or fallback.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading

__all__ = ["read_direct"]

_BLOCK = 512  # O_DIRECT's length and offset alignment on most devices (a 4Kn disk refuses it: read as usual)
_LARGEST = 1 << 20
_REFUSED = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)
_buffers = threading.local()


def read_direct(fd: int, size: int) -> bytes | None:
    """The ``size`` bytes of the file open as ``fd``, read around the page cache; None where the filesystem
    refuses a direct read (tmpfs on older kernels, FUSE, NFS without it), the file is not ``size`` bytes
    long, or ``size`` is 0 or more than 1 MiB: the caller reads it as usual. The descriptor's flags are as
    they were afterwards."""
    if not 0 < size <= _LARGEST:
        return None
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    span = -(-size // _BLOCK) * _BLOCK
    buffer = _buffer(span)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
        with memoryview(buffer) as view:
            got = os.preadv(fd, [view[:span]], 0)
        return buffer[:size] if got == size else None
    except OSError as exc:
        if exc.errno in _REFUSED:
            return None
        raise
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def _buffer(span: int) -> mmap.mmap:
    """This thread's buffer of at least ``span`` bytes, page-aligned, kept for its next read: a mapping made
    and unmade for each read cost ~30 us of CPU, more than the read itself (6 KB files, one core). Private:
    Python maps an anonymous buffer shared by default, and a worker forked after its parent read would then
    read into the parent's (and its siblings') pages at once, serving one another's bytes."""
    buffer = getattr(_buffers, "mapping", None)
    if buffer is None or len(buffer) < span:
        if buffer is not None:
            buffer.close()
        length = -(-span // mmap.PAGESIZE) * mmap.PAGESIZE
        buffer = _buffers.mapping = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE)
    return buffer
