"""The job's memory cgroups: what each version's files say (``V1``, ``V2``), and where the job's cgroup and
its ancestors are, from ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` (``memberships``, ``mounts``,
``levels``). The memory view reads them (``memory.py``)."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass

__all__ = ["V1", "V2", "CgroupLevel", "CgroupVersion", "levels", "memberships", "mounts"]


@dataclass(frozen=True)
class CgroupVersion:
    """The files of one cgroup version: limits (the smallest binds), usage, the file cache, and the part of it
    that processes map."""

    name: str
    limits: tuple[str, ...]
    usage: str
    file_cache: re.Pattern[bytes]
    mapped: re.Pattern[bytes]


# usage_in_bytes counts the cgroup's descendants (v1), so does its file cache under the total_ keys
V1 = CgroupVersion(
    "v1",
    ("memory.limit_in_bytes",),
    "memory.usage_in_bytes",
    re.compile(rb"^total_(?:in)?active_file (\d+)$", re.M),
    re.compile(rb"^total_mapped_file (\d+)$", re.M),
)
V2 = CgroupVersion(
    "v2",
    ("memory.max", "memory.high"),
    "memory.current",
    re.compile(rb"^(?:in)?active_file (\d+)$", re.M),
    re.compile(rb"^file_mapped (\d+)$", re.M),
)


@dataclass(frozen=True)
class CgroupLevel:
    version: CgroupVersion
    directory: str
    name: str  # the cgroup's path in its hierarchy, as /proc/self/cgroup writes it


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)  # mountinfo writes a space as \040


def memberships(text: str) -> dict[str, str]:
    """The job's memory cgroup path per version, from /proc/self/cgroup."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            found["v1"] = path
        elif hierarchy == "0" and not controllers:
            found["v2"] = path
    return found


def mounts(text: str) -> dict[str, tuple[str, str]]:
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


def levels(version: CgroupVersion, path: str, root: str, point: str) -> tuple[CgroupLevel, ...]:
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
            levels.append(CgroupLevel(version, directory, name))
        if directory == point or directory == "/":
            return tuple(levels)
        directory = posixpath.dirname(directory)
