"""The operating-system layer that ``loader`` and ``stallbench`` both use, in one public place.

* ``private``: folders and files only this user can reach, created with ``O_EXCL``/``O_NOFOLLOW`` and
  checked when reused (``/dev/shm`` and ``/tmp`` are shared with other users);
* ``locks``: the cache's writer ids and mutex (POSIX record locks);
* ``libc``: the C calls ``os`` and ``mmap`` lack (a raw ``mmap``, ``madvise``, ``mincore``, ``cachestat``);
* ``pagecache``: which pages of a file the page cache holds, reads that evict only what they brought in;
* ``memory``, ``sizing``, ``headroom``: the memory the job may still take (cgroup v1 and v2, the machine),
  how big a cache may be (the reserve it leaves for the job's own growth), and the gauge of whether memory
  is short now; ``home``: where a cache lives by default, and whether the kernel can take its pages back;
  ``forkgrowth``: what forking workers grew it by;
* ``counters``: the kernel's counts of a process tree, bytes read from storage and CPU seconds (loaded
  alone from its file by a child that imports nothing else, so it imports only the standard library).
"""

from loader.system.counters import cpu_seconds, read_bytes, storage_read_bytes
from loader.system.memory import MemoryView, memory_view
from loader.system.pagecache import PAGE, can_tell, resident_pages
from loader.system.private import UntrustedCacheError, open_private, private_dir
from loader.system.sizing import reserve_for_limit

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
