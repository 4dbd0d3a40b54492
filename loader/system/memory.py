"""How much memory the job may still take: the memory view (what the cache makes of it: ``headroom.py``).

The cache lives in /dev/shm: its pages are shmem, which the kernel cannot reclaim without swap, so a cache
that outgrows the job's memory gets the job killed. What the cache may take is therefore a limit less the
usage the kernel cannot reclaim: anon memory and shmem count; the page cache of files (``active_file`` and
``inactive_file`` in ``memory.stat``) does not, as the kernel drops it before it kills, except the pages
processes map (``mapped_file``: the libraries' code and data, 76 MiB in a process that imports torch, charged
to the cgroup that first read them), which the job would fault straight back in from storage. Every cgroup
from the job's own up to the hierarchy's root can hold a limit (v1 or v2), and the machine can run out
before any of them, so the headroom is the smallest of them all and of the machine's MemAvailable.

The cgroup files are found once per process (and again after a fork, since a worker may be moved), so a
view costs a handful of small file reads. Where they cannot be read, only /proc/meminfo counts: a memory
view never raises.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

import humanize

from loader.system._cgroups import V1, V2, CgroupLevel, CgroupVersion, levels, memberships, mounts

__all__ = ["MemoryView", "format_bytes", "memory_view"]

_PROC_CGROUP = "/proc/self/cgroup"  # module constants so that tests can point them at fixtures
_MOUNTINFO = "/proc/self/mountinfo"
_MEMINFO = "/proc/meminfo"
_NO_LIMIT = 1 << 62  # v1 writes "no limit" as 2**63 rounded down to a page
_MEMINFO_KB = re.compile(rb"^(MemTotal|MemAvailable):\s+(\d+) kB$", re.M)


@dataclass(frozen=True)
class MemoryView:
    """Memory the job can still take (``headroom``) under the ``limit`` that binds, named by ``source``."""

    headroom: int
    limit: int
    source: str


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=1)
def _hierarchy() -> tuple[CgroupLevel, ...]:
    """This process's memory cgroup and its ancestors; none when their files cannot be found or read."""
    try:
        member_of = memberships(Path(_PROC_CGROUP).read_text())
        mounted = mounts(Path(_MOUNTINFO).read_text())
    except (OSError, ValueError):
        return ()
    for version in (V1, V2):  # v1 first: on a hybrid machine, v2 has no memory controller
        if version.name in member_of and version.name in mounted:
            found = levels(version, member_of[version.name], *mounted[version.name])
            if found:
                return found
    return ()


os.register_at_fork(after_in_child=_hierarchy.cache_clear)


def _limit(version: CgroupVersion, directory: str) -> int | None:
    limits = [_read(posixpath.join(directory, name)).strip() for name in version.limits]
    values = [int(v) for v in limits if v != b"max" and int(v) < _NO_LIMIT]
    return min(values, default=None)


def _level_view(level: CgroupLevel) -> MemoryView | None:
    """Headroom under this cgroup's limit; None when it has none or its files cannot be read."""
    version = level.version
    try:
        limit = _limit(version, level.directory)
        if limit is None:
            return None
        usage = int(_read(posixpath.join(level.directory, version.usage)))
        stat = _read(posixpath.join(level.directory, "memory.stat"))
    except (OSError, ValueError):
        return None
    mapped = sum(map(int, version.mapped.findall(stat)))
    unreclaimable = usage - max(0, sum(map(int, version.file_cache.findall(stat))) - mapped)
    source = f"the cgroup {version.name} memory limit of {level.name} ({format_bytes(limit)})"
    return MemoryView(max(0, limit - unreclaimable), limit, source)


def _machine() -> MemoryView:
    try:
        kb = {key: int(value) for key, value in _MEMINFO_KB.findall(_read(_MEMINFO))}
        available, total = kb[b"MemAvailable"] << 10, kb[b"MemTotal"] << 10
    except (OSError, KeyError):  # not Linux, or a kernel older than MemAvailable
        import psutil  # here: on Linux no process of the job needs it (0.8 MiB)

        memory = psutil.virtual_memory()
        available, total = memory.available, memory.total
    return MemoryView(available, total, "the machine's MemAvailable")


def memory_view() -> MemoryView:
    """The tightest of the job's memory cgroups (v1 or v2) and the machine's MemAvailable, read now."""
    tightest = _machine()
    for level in _hierarchy():
        view = _level_view(level)
        if view is not None and view.headroom < tightest.headroom:
            tightest = view
    return tightest


def format_bytes(n: int) -> str:
    """``n`` in binary units, as people read a memory size: "0 Bytes", "64.0 MiB", "1.2 GiB"
    (``humanize.naturalsize``, as stallbench's reports use it in decimal units)."""
    return humanize.naturalsize(n, binary=True, format="%.1f")
