"""Where a cache lives by default, and whether the kernel can take its memory back.

A store's records sit in the pages of its data file. On a disk filesystem those pages are page cache: the
kernel keeps them while memory is spare and, when the job needs it (an evaluation, a checkpoint, a heap that
grows), writes back any that are dirty and drops them before it would kill a process; a record whose pages
went is then read from the local disk. On a tmpfs (``/dev/shm``) or ramfs they are shared memory, which the
kernel cannot reclaim without swap: a store there that meets the job's peak gets the job killed. So the
default home is a folder on a local disk, ``/var/tmp`` (kept across reboots, and by the FHS never a tmpfs,
unlike ``/tmp`` on many systems), or ``$STALLBENCH_CACHE_DIR``; ``holds_memory`` tells which kind a folder is,
from the kernel's own answer for the path (``statfs``), so a bind mount or a tmpfs mounted anywhere is seen
for what it is. Measured under a 300 MiB cgroup v1 limit: 238 MiB of records written to a file in
``/var/tmp``, then 250 MiB of anonymous memory taken at once: the job lived and read its records again from
disk; 143 MiB in ``/dev/shm`` and 200 MiB taken: the job was OOM-killed (docs/concepts/minio-cache.md).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from loader.system.libc import libc

__all__ = ["CACHE_DIR_VARIABLE", "default_cache_dir", "holds_memory"]

CACHE_DIR_VARIABLE = "STALLBENCH_CACHE_DIR"
_FALLBACK = "/var/tmp"
_IN_MEMORY = frozenset({0x01021994, 0x858458F6})  # TMPFS_MAGIC, RAMFS_MAGIC (linux/magic.h)
_STATFS_BYTES = 256  # more than struct statfs takes on any Linux ABI; f_type is its first field

libc.statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]


def default_cache_dir() -> Path:
    """The folder a cache lives in when ``cache_dir`` is not given: ``$STALLBENCH_CACHE_DIR``, else
    ``/var/tmp``. Read at each call, so a job may set it before it makes its loaders."""
    return Path(os.environ.get(CACHE_DIR_VARIABLE) or _FALLBACK)


def holds_memory(path: str | os.PathLike) -> bool:
    """Whether files under ``path`` live in memory the kernel cannot reclaim (a tmpfs or ramfs); False for a
    disk filesystem, whose pages are page cache, and where the kernel will not say (not Linux)."""
    buffer = ctypes.create_string_buffer(_STATFS_BYTES)
    if libc.statfs(os.fsencode(path), buffer) != 0:
        return False
    f_type = ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF
    return f_type in _IN_MEMORY
