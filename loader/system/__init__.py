"""The operating-system layer that ``loader`` and ``stallbench`` both use, in one public place.

* ``private``: folders and files only this user can reach, created with ``O_EXCL``/``O_NOFOLLOW`` and
  checked when reused (``/dev/shm`` and ``/tmp`` are shared with other users);
* ``locks``: the cache's writer ids and mutex (POSIX record locks);
* ``libc``: the C calls ``os`` and ``mmap`` lack (a raw ``mmap``, ``madvise``, ``mincore``);
* ``pagecache``: which pages of a file the page cache holds, reads that evict only what they brought in;
* ``memory``, ``headroom``: the memory the job may still take (cgroup v1 and v2, the machine) and the
  reserve the cache leaves for the job's own growth; ``forkgrowth``: what forking workers grew it by;
* ``counters``: the kernel's counts of a process tree, bytes read from storage and CPU seconds (loaded
  alone from its file by a child that imports nothing else, so it imports only the standard library).
"""

from loader.system.counters import cpu_seconds, read_bytes, storage_read_bytes
from loader.system.headroom import reserve_for_limit
from loader.system.memory import MemoryView, memory_view
from loader.system.pagecache import PAGE, can_tell, file_residency, resident_pages
from loader.system.private import UntrustedCacheError, open_private, private_dir

__all__ = [
    "PAGE",
    "MemoryView",
    "UntrustedCacheError",
    "can_tell",
    "cpu_seconds",
    "file_residency",
    "memory_view",
    "open_private",
    "private_dir",
    "read_bytes",
    "reserve_for_limit",
    "resident_pages",
    "storage_read_bytes",
]
