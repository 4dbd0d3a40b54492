"""How much memory the job may still take: the memory view (what the cache makes of it: ``headroom.py``).

A cache in a tmpfs (/dev/shm) holds shmem, which the kernel cannot reclaim without swap, so one that
outgrows the job's memory gets the job killed; a cache on a disk (the default home) holds page cache. What
the job may take is therefore a limit less the usage the kernel cannot reclaim: anon memory and shmem count;
the page cache of files (``active_file`` and ``inactive_file`` in ``memory.stat``, a disk store's own pages
among them) does not, as the kernel drops it before it kills. Every memory cgroup
from the job's own up to the hierarchy's root can hold a limit (v1 or v2), and the machine can run out
before any of them, so the headroom is the smallest of them all and of the machine's MemAvailable.

The cgroup files are found once per process (and again after a fork, since a worker may be moved), so a
view costs a handful of small file reads. Where they cannot be read, only /proc/meminfo counts: a memory
view never raises.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

import humanize

from loader.system.mounts import parse_mounts

__all__ = ["MemoryView", "format_bytes", "memory_view"]

_PROC_CGROUP = "/proc/self/cgroup"  # module constants so that tests can point them at fixtures
_MOUNTINFO = "/proc/self/mountinfo"
_MEMINFO = "/proc/meminfo"
_NO_LIMIT = 1 << 62  # v1 writes "no limit" as 2**63 rounded down to a page
_MEMINFO_KB = re.compile(rb"^(MemTotal|MemAvailable):\s+(\d+) kB$", re.M)


@dataclass(frozen=True)
class MemoryView:
    """Memory the job can still take (``headroom``) under the ``limit`` that binds, named by ``source``;
    ``kernel``: of the usage counted against the headroom, the kernel's own memory the cgroup is charged for
    (v1: ``memory.kmem.usage_in_bytes``; v2: ``slab_reclaimable``; 0 where unknown): the buffer heads of a
    store's written pages among it (``headroom.py``)."""

    headroom: int
    limit: int
    source: str
    kernel: int = 0


@dataclass(frozen=True)
class _Version:
    """The files of one cgroup version: limits (the smallest binds), usage, and reclaimable file cache."""

    name: str
    limits: tuple[str, ...]
    usage: str
    file_cache: re.Pattern[bytes]
    kernel: str | re.Pattern[bytes]  # a file of its own (v1) or a line of memory.stat (v2)


# usage_in_bytes counts the cgroup's descendants (v1), so does its file cache under the total_ keys
_V1 = _Version(
    "v1",
    ("memory.limit_in_bytes",),
    "memory.usage_in_bytes",
    re.compile(rb"^total_(?:in)?active_file (\d+)$", re.M),
    "memory.kmem.usage_in_bytes",
)
_V2 = _Version(
    "v2",
    ("memory.max", "memory.high"),
    "memory.current",
    re.compile(rb"^(?:in)?active_file (\d+)$", re.M),
    re.compile(rb"^slab_reclaimable (\d+)$", re.M),
)


@dataclass(frozen=True)
class _Level:
    version: _Version
    directory: str
    name: str  # the cgroup's path in its hierarchy, as /proc/self/cgroup writes it


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _memberships(text: str) -> dict[str, str]:
    """The job's memory cgroup path per version, from /proc/self/cgroup."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            found["v1"] = path
        elif hierarchy == "0" and not controllers:
            found["v2"] = path
    return found


def _mounts(text: str) -> dict[str, tuple[str, str]]:
    """(root inside the hierarchy, mount point) of the memory hierarchy per version, from mountinfo."""
    found: dict[str, tuple[str, str]] = {}
    for mount in parse_mounts(text):
        if mount.fstype == "cgroup" and "memory" in mount.options:
            found.setdefault("v1", (mount.root, mount.point))
        elif mount.fstype == "cgroup2":
            found.setdefault("v2", (mount.root, mount.point))
    return found


def _levels(version: _Version, path: str, root: str, point: str) -> tuple[_Level, ...]:
    """The job's cgroup and its ancestors up to the mount point, each that has the version's limit file."""
    base = root.rstrip("/")
    inside = path[len(base) :] if path == root or path.startswith(base + "/") else path  # else: a namespace's
    start = posixpath.normpath(posixpath.join(point, inside.lstrip("/")))
    if not (start + "/").startswith(point.rstrip("/") + "/") or not os.path.isdir(start):
        start = point  # the path names a cgroup this mount does not show; what it shows is the job's own
    levels, directory = [], start
    while True:
        if os.path.exists(posixpath.join(directory, version.limits[0])):
            name = posixpath.normpath(posixpath.join(root, posixpath.relpath(directory, point)))
            levels.append(_Level(version, directory, name))
        if directory == point or directory == "/":
            return tuple(levels)
        directory = posixpath.dirname(directory)


@functools.lru_cache(maxsize=1)
def _hierarchy() -> tuple[_Level, ...]:
    """This process's memory cgroup and its ancestors; none when their files cannot be found or read."""
    try:
        memberships = _memberships(Path(_PROC_CGROUP).read_text())
        mounts = _mounts(Path(_MOUNTINFO).read_text())
    except (OSError, ValueError):
        return ()
    for version in (_V1, _V2):  # v1 first: on a hybrid machine, v2 has no memory controller
        if version.name in memberships and version.name in mounts:
            levels = _levels(version, memberships[version.name], *mounts[version.name])
            if levels:
                return levels
    return ()


os.register_at_fork(after_in_child=_hierarchy.cache_clear)


def _limit(version: _Version, directory: str) -> int | None:
    limits = [_read(posixpath.join(directory, name)).strip() for name in version.limits]
    values = [int(v) for v in limits if v != b"max" and int(v) < _NO_LIMIT]
    return min(values, default=None)


def _level_view(level: _Level) -> tuple[MemoryView, bytes] | None:
    """Headroom under this cgroup's limit (its ``kernel`` left 0) and the ``memory.stat`` it was read from;
    None when it has no limit or its files cannot be read."""
    version = level.version
    try:
        limit = _limit(version, level.directory)
        if limit is None:
            return None
        usage = int(_read(posixpath.join(level.directory, version.usage)))
        stat = _read(posixpath.join(level.directory, "memory.stat"))
    except (OSError, ValueError):
        return None
    unreclaimable = usage - sum(int(n) for n in version.file_cache.findall(stat))
    source = f"the cgroup {version.name} memory limit of {level.name} ({format_bytes(limit)})"
    return MemoryView(max(0, limit - unreclaimable), limit, source), stat


def _kernel(level: _Level, stat: bytes) -> int:
    kernel = level.version.kernel
    if isinstance(kernel, re.Pattern):
        found = kernel.search(stat)
        return int(found[1]) if found else 0
    try:
        return int(_read(posixpath.join(level.directory, kernel)))
    except (OSError, ValueError):  # a kernel built without kmem accounting
        return 0


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
    tightest, binding = _machine(), None
    for level in _hierarchy():
        found = _level_view(level)
        if found is not None and found[0].headroom < tightest.headroom:
            tightest, binding = found[0], (level, found[1])
    if binding is None:
        return tightest
    return dataclasses.replace(tightest, kernel=_kernel(*binding))  # read for the limit that binds alone


def format_bytes(n: int) -> str:
    """``n`` in binary units, as people read a memory size: "0 Bytes", "64.0 MiB", "1.2 GiB"
    (``humanize.naturalsize``, as stallbench's reports use it in decimal units)."""
    return humanize.naturalsize(n, binary=True, format="%.1f")
