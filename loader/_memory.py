"""How much memory the cache may still take, and whether memory is short now.

The cache lives in /dev/shm: its pages are shmem, which the kernel cannot reclaim without swap, so a cache
that outgrows the job's memory gets the job killed. What the cache may take is therefore a limit less the
usage the kernel cannot reclaim: anon memory and shmem count; the page cache of files (``active_file`` and
``inactive_file`` in ``memory.stat``) does not, as the kernel drops it before it kills. Every memory cgroup
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
from time import monotonic

import psutil

__all__ = [
    "MemoryView",
    "PressureGauge",
    "auto_cache_bytes",
    "format_bytes",
    "memory_view",
    "reserve_bytes",
    "reserve_for_limit",
]

_PROC_CGROUP = "/proc/self/cgroup"  # module constants so that tests can point them at fixtures
_MOUNTINFO = "/proc/self/mountinfo"
_MEMINFO = "/proc/meminfo"
_NO_LIMIT = 1 << 62  # v1 writes "no limit" as 2**63 rounded down to a page
_MIB = 1 << 20
_MEMINFO_KB = re.compile(rb"^(MemTotal|MemAvailable):\s+(\d+) kB$", re.M)


@dataclass(frozen=True)
class MemoryView:
    """Memory the job can still take (``headroom``) under the ``limit`` that binds, named by ``source``."""

    headroom: int
    limit: int
    source: str


@dataclass(frozen=True)
class _Version:
    """The files of one cgroup version: limits (the smallest binds), usage, and reclaimable file cache."""

    name: str
    limits: tuple[str, ...]
    usage: str
    file_cache: re.Pattern[bytes]


# usage_in_bytes counts the cgroup's descendants (v1), so does its file cache under the total_ keys
_V1 = _Version(
    "v1",
    ("memory.limit_in_bytes",),
    "memory.usage_in_bytes",
    re.compile(rb"^total_(?:in)?active_file (\d+)$", re.M),
)
_V2 = _Version(
    "v2", ("memory.max", "memory.high"), "memory.current", re.compile(rb"^(?:in)?active_file (\d+)$", re.M)
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


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)  # mountinfo writes a space as \040


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
    for line in text.splitlines():
        fields, tail = line.split(" - ", 1)
        fstype, _, options = tail.split(" ", 2)
        root, point = (_unescape(f) for f in fields.split()[3:5])
        if fstype == "cgroup" and "memory" in options.split(","):
            found.setdefault("v1", (root, point))
        elif fstype == "cgroup2":
            found.setdefault("v2", (root, point))
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


def _level_view(level: _Level) -> MemoryView | None:
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
    unreclaimable = usage - sum(int(n) for n in version.file_cache.findall(stat))
    source = f"the cgroup {version.name} memory limit of {level.name} ({format_bytes(limit)})"
    return MemoryView(max(0, limit - unreclaimable), limit, source)


def _machine() -> MemoryView:
    try:
        kb = {key: int(value) for key, value in _MEMINFO_KB.findall(_read(_MEMINFO))}
        available, total = kb[b"MemAvailable"] << 10, kb[b"MemTotal"] << 10
    except (OSError, KeyError):
        memory = psutil.virtual_memory()  # not Linux, or a kernel older than MemAvailable
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


def reserve_bytes(view: MemoryView) -> int:
    """Memory to leave free for the job's own growth: 5% of the limit, at least 128 MiB.

    The growth is mostly copy-on-write: a DataLoader worker shares its parent's pages when forked and copies
    each one it writes to (a refcount is a write), so a job's charged memory keeps growing through its first
    epoch. Measured: 2 workers of a 168 MB parent grew the job by 61 MB after the cache stopped admitting at
    64 MiB free, and the kernel killed it; 128 MiB covers that."""
    return reserve_for_limit(view.limit)


def reserve_for_limit(limit: int) -> int:
    """What the cache leaves free under a memory limit of ``limit`` bytes (``reserve_bytes``)."""
    return max(128 * _MIB, limit * 5 // 100)


def format_bytes(n: int) -> str:
    """``n`` in binary units, as people read them: "512 B", "64 MiB", "1.2 GiB"."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"


def auto_cache_bytes(wanted: int, view: MemoryView | None = None) -> tuple[int, str]:
    """Bytes to give the cache: ``wanted``, within the headroom less the reserve; and a sentence why."""
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
        raise ValueError(f"wanted must be a non-negative int, got {wanted!r}")
    view = memory_view() if view is None else view
    reserve = reserve_bytes(view)
    chosen = max(0, min(wanted, view.headroom - reserve))
    free = f"{format_bytes(view.headroom)} free per {view.source}"
    if chosen == wanted:
        return chosen, f"{format_bytes(chosen)}: the dataset's size, within {free}"
    return chosen, f"{format_bytes(chosen)}: {free}, less {format_bytes(reserve)} kept free"


class PressureGauge:
    """Tells whether memory is short; reads the memory view at most every ``interval`` seconds or after
    ``bytes_between`` bytes were noted, whichever comes first.

    Bytes noted (the ``adding`` of each call that was not short) count as taken until the next read, so a
    burst of admissions between two reads cannot overrun the reserve. ``bytes_between`` defaults to an
    eighth of the reserve.
    """

    def __init__(self, interval: float = 0.05, bytes_between: int | None = None) -> None:
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        if bytes_between is not None and (isinstance(bytes_between, bool) or bytes_between <= 0):
            raise ValueError(f"bytes_between must be a positive int or None, got {bytes_between!r}")
        self.interval = interval
        self.bytes_between = bytes_between
        self.last: MemoryView | None = None
        self._read_at = 0.0
        self._noted = 0
        self._reserve = 0

    def short(self, adding: int = 0) -> bool:
        """Whether taking ``adding`` more bytes would leave less than the reserve free."""
        view = self.last
        if view is None or self._due(adding):
            view = self._read()
        is_short = view.headroom - self._noted - adding < self._reserve
        if not is_short:
            self._noted += adding
        return is_short

    def _due(self, adding: int) -> bool:
        between = self.bytes_between if self.bytes_between is not None else self._reserve // 8
        return self._noted + adding >= between or monotonic() - self._read_at >= self.interval

    def _read(self) -> MemoryView:
        self.last = view = memory_view()
        self._read_at, self._noted, self._reserve = monotonic(), 0, reserve_bytes(view)
        return view
