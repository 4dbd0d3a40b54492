"""The operating-system layer that ``loader`` and ``stallbench`` both use, in one public place.

* ``private``: folders and files only this user can reach, created with ``O_EXCL``/``O_NOFOLLOW`` and
  checked when reused (``/dev/shm`` and ``/tmp`` are shared with other users);
* ``locks``: the cache's writer ids and mutex (POSIX record locks);
* ``libc``: the C calls ``os`` and ``mmap`` lack (a raw ``mmap``, ``madvise``, ``mincore``, ``cachestat``);
* ``pagecache``: which pages of a file the page cache holds, reads that evict only what they brought in,
  and a whole file evicted, dirty pages too;
* ``mounts``: the kernel's mount table, and the mount that holds a path;
* ``memory``, ``sizing``, ``headroom``: the memory the job may still take (cgroup v1 and v2, the machine),
  how big a cache may be (the reserve it leaves for the job's own growth), and the gauge of whether memory
  is short now; ``home``: where a cache lives by default, and whether the kernel can take its pages back;
  ``forkgrowth``: what forking workers grew it by;
* ``counters``: the kernel's counts of a process tree, bytes read from storage and CPU seconds (it imports
  only the standard library: a child that reads storage imports it and nothing else).

Each name here is imported from its module when first used (PEP 562), as ``loader``'s are: importing one
module of the layer (``loader.system.counters``) loads only that module and what it imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader._lazy import lazy_names

if TYPE_CHECKING:
    from loader.system.counters import cpu_seconds, read_bytes, storage_read_bytes
    from loader.system.memory import MemoryView, memory_view
    from loader.system.pagecache import PAGE, can_tell, resident_pages
    from loader.system.private import UntrustedCacheError, open_private, private_dir
    from loader.system.sizing import reserve_for_limit

_HOMES = {
    "cpu_seconds": "loader.system.counters",
    "read_bytes": "loader.system.counters",
    "storage_read_bytes": "loader.system.counters",
    "MemoryView": "loader.system.memory",
    "memory_view": "loader.system.memory",
    "PAGE": "loader.system.pagecache",
    "can_tell": "loader.system.pagecache",
    "resident_pages": "loader.system.pagecache",
    "UntrustedCacheError": "loader.system.private",
    "open_private": "loader.system.private",
    "private_dir": "loader.system.private",
    "reserve_for_limit": "loader.system.sizing",
}

__all__ = [
    "PAGE",
    "MemoryView",
    "UntrustedCacheError",
    "can_tell",
    "cpu_seconds",
    "memory_view",
    "open_private",
    "private_dir",
    "read_bytes",
    "reserve_for_limit",
    "resident_pages",
    "storage_read_bytes",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
