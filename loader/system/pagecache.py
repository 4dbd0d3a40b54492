"""The page-cache pages of a record that the loader's own cache holds (Linux): left to the kernel until the
store has shown that it keeps the record, then evicted.

The loader's cache holds the records it admitted; the page cache should not hold them a second time. But
only those: a record the cache did not admit keeps its pages, so spare memory serves it as it would serve
torch's loader, and pages that were resident before our read (another job's warm pages) are never evicted.
Nor are an admitted record's pages evicted when it is admitted: a store short of memory gives back the
records it admitted last, and a record given back before anyone read it again would then be in neither
cache. (Measured on the digits job of ``bench_tight_budget`` at L = D/2 + M, evicting at admission: the
store gave back all ~26 MB it had admitted in epoch 1 when the evaluation workers forked, and ours read
26-39 MB per later epoch where torch's loader read 8-13.) So a read that brought every page of the record
in tells the store so (``admit(raw, ours=True)``), and the store's first hit of the record evicts them
(``evict_file``; ``MappedFile.evict`` for a memory-mapped Arrow IPC value). Until then they are pages read
once and not since, the first the kernel reclaims.

What was resident before a read is asked of the kernel's ``cachestat`` (``resident_count``: one system call,
~1.4 us, where ``mincore``'s mapping, call and unmapping took ~12 for a 4 KB file: a fifth of a miss's cost
in one process), else of ``mincore``, which reads nothing either (``resident_pages``: a fresh mapping of the
file, never touched). The kernel answers either truthfully only to the file's owner or a writer;
for anyone else a ``preadv2(RWF_NOWAIT)`` copies what the page cache holds up to the first page it does not
(``resident_prefix``): a read that found none resident is ours. Where residency cannot be learned (a
filesystem without ``RWF_NOWAIT``), or some pages were resident, nothing is evicted.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
from collections.abc import Callable

import numpy as np

from loader.system.direct import read_direct
from loader.system.libc import MAP_FAILED, cached_pages
from loader.system.libc import libc as _libc

__all__ = [
    "PAGE",
    "can_tell",
    "drop_file",
    "evict_file",
    "file_residency",
    "mincore",
    "prefetch",
    "read_admitting",
    "resident_count",
    "resident_pages",
    "resident_prefix",
    "wholly_resident",
]

PAGE = mmap.PAGESIZE
_CANNOT_TELL = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)
_TAIL_READ = 1 << 20  # a read past a file's expected end: what it grew by, or the rest of a short read
_PROBED_BYTES = 1 << 20  # what ``wholly_resident`` copies at most where the kernel will not say


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


def resident_count(fd: int, size: int) -> int | None:
    """Pages of the file's first ``size`` bytes resident now (``cachestat``, else ``mincore``); None where the
    kernel will not tell the truth (``can_tell``) or the file is empty."""
    if size == 0:
        return None
    count = cached_pages(fd, 0, size)
    if count is not None:
        return count
    pages = resident_pages(fd, size)
    return None if pages is None else int(pages.sum())


def wholly_resident(fd: int, size: int) -> bool | None:
    """Whether every page of the file's first ``size`` bytes is resident now, asked as ``read_admitting``
    asks (``resident_count``, else the ``RWF_NOWAIT`` probe, of at most its first ``_PROBED_BYTES``: the
    probe copies what it finds); None for an empty file or where the filesystem cannot tell."""
    if size == 0:
        return None
    count = resident_count(fd, size)
    if count is not None:
        return count * PAGE >= size
    length = min(size, _PROBED_BYTES)
    head = resident_prefix(fd, 0, length)
    return None if head is None else len(head) == length


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


def read_admitting(
    path: str,
    admit: Callable[[bytes, bool], bool],
    takes: Callable[[int], bool] | None = None,
    resident: Callable[[bool], None] | None = None,
) -> tuple[bytes, bool]:
    """Read a whole file and offer it to ``admit(raw, ours) -> bool``; ``ours``: this read brought every
    page of the file into the page cache (none was resident before it), so they are the store's to evict
    at the record's first hit (``evict_file``). Where ``mincore`` says none was resident and ``takes(size)``
    says the store will keep it, the file is read around the page cache instead (``system.direct``: in the
    device's own blocks, never held twice), and ``ours`` is False: there is nothing to evict. (Not where
    the ``RWF_NOWAIT`` probe answers: it starts the kernel's readahead of what it did not find.)
    ``resident`` is told whether every page of the file was resident before the read, where the kernel
    says (never for an empty file)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # not a FileIO: its object cost ~1 us of a 4 KB miss
    try:
        size = os.fstat(fd).st_size
        before = resident_count(fd, size)
        if before is not None:
            if resident is not None:
                resident(before * PAGE >= size)
            cold = before == 0
            if cold and takes is not None and takes(size) and (raw := read_direct(fd, size)) is not None:
                return raw, admit(raw, False)
            raw = _read_to_end(fd, size)
            return raw, admit(raw, cold)
        head = resident_prefix(fd, 0, size)
        if head is None:  # this filesystem cannot tell what was resident: none of it is known to be ours
            raw = _read_to_end(fd, size)
            return raw, admit(raw, False)
        if resident is not None and size:
            resident(len(head) == size)
        raw = bytes(head) + os.pread(fd, size - len(head), len(head)) if len(head) < size else bytes(head)
        return raw, admit(raw, not head)
    finally:
        os.close(fd)


def _read_to_end(fd: int, size: int) -> bytes:
    """The file's bytes from where ``fd`` stands to its end, ``size`` (its fstat) expected: read until the
    kernel says the end, as ``FileIO.readall`` does (a file grown since, a filesystem giving short reads),
    asking a small read at a time past ``size`` so that no read allocates the whole size again."""
    raw = os.read(fd, size + 1)
    if not raw:
        return raw
    chunks = [raw]
    while chunk := os.read(fd, _TAIL_READ):
        chunks.append(chunk)
    return raw if len(chunks) == 1 else b"".join(chunks)


def evict_file(path: str) -> None:
    """Evict the file's clean, unmapped pages from the page cache; a file gone since is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        drop_file(fd)
    finally:
        os.close(fd)


def evict_written_back(path: str | os.PathLike) -> int:
    """Evict the whole file from the page cache, its dirty pages too (the advice leaves them: where pages
    stay, or the kernel will not say, the file is written back and advised again); its size. Pages mapped by
    a process, and those of a memory-only filesystem (tmpfs), stay. Needs no privilege; OSError where the file
    cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        drop_file(fd)
        if size and resident_count(fd, size) != 0:  # None: the kernel will not say; written back to be sure
            with contextlib.suppress(OSError):  # no fsync there (squashfs, iso9660): nothing dirty either
                os.fdatasync(fd)
            drop_file(fd)
        return size
    finally:
        os.close(fd)


def drop_file(fd: int, offset: int = 0, length: int = 0) -> None:
    """Evict the file's unmapped, clean pages in ``[offset, offset + length)`` (length 0: to the end)."""
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def prefetch(address: int, length: int) -> None:
    """Read a mapped multi-page range in one request (under MADV_RANDOM each fault would read one page)."""
    if length > PAGE:
        start = address - address % PAGE
        _libc.madvise(start, address + length - start, mmap.MADV_WILLNEED)
