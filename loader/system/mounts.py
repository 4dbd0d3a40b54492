"""The kernel's mount table (``/proc/self/mountinfo``): each mount's root inside its filesystem, its mount
point, filesystem type and super options, and the mount that holds a path. Read by the loader (the memory
cgroup's mounts, ``memory``) and by stallbench (a path's filesystem and the cgroup controllers it drives).
Written by hand: psutil's ``disk_partitions`` gives neither a mount's root nor its super options."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MOUNTINFO", "Mount", "mount_of", "mounts", "parse_mounts"]

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    """One line of the table: ``root`` is the folder of the filesystem mounted at ``point``."""

    root: str
    point: str
    fstype: str
    options: frozenset[str]  # the super options (a cgroup v1 mount's controllers among them)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)  # mountinfo writes a space as \040


def parse_mounts(text: str) -> list[Mount]:
    """The mounts of a mountinfo text, in its order."""
    found = []
    for line in text.splitlines():
        fields, tail = line.split(" - ", 1)
        fstype, _, options = tail.split(" ", 2)
        root, point = (_unescape(f) for f in fields.split()[3:5])
        found.append(Mount(root, point, fstype, frozenset(options.split(","))))
    return found


def mounts() -> list[Mount]:
    """This process's mounts; OSError where the table cannot be read (not Linux)."""
    return parse_mounts(Path(MOUNTINFO).read_text())


def mount_of(path: str | os.PathLike) -> Mount:
    """The mount that holds ``path`` (its real path): the deepest mount point above it."""
    real = os.path.realpath(path)
    inside = [m for m in mounts() if real == m.point or real.startswith(m.point.rstrip("/") + "/")]
    return max(inside, key=lambda m: len(m.point))
