"""The kernel's mount table, and what it says of a path: its filesystem's type and the disk under it."""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["StorageConditionUnavailable", "block_device", "filesystem_type", "mounts"]


class StorageConditionUnavailable(RuntimeError):
    """A storage condition cannot be set up here; the message says what was not possible and why."""


def mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, filesystem type, super options) of each mount, from /proc/self/mountinfo."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as e:
        raise StorageConditionUnavailable(
            f"cannot read /proc/self/mountinfo ({e.strerror}): not Linux?"
        ) from e
    mounts = []
    for line in lines:
        fields, tail = line.split(" - ", 1)
        fstype, _, opts = tail.split(" ", 2)
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields.split()[4])  # \040 is a space
        mounts.append((point, fstype, set(opts.split(","))))
    return mounts


def filesystem_type(path: str | os.PathLike) -> str:
    """Type of the filesystem that holds ``path`` (ext4, xfs, tmpfs, overlay, nfs4, ...)."""
    real = os.path.realpath(path)
    inside = [(p, t) for p, t, _ in mounts() if real == p or real.startswith(p.rstrip("/") + "/")]
    return max(inside, key=lambda m: len(m[0]))[1]


def block_device(path: str | os.PathLike) -> str:
    """``"major:minor"`` of the whole disk that holds ``path`` (a partition maps to its disk)."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if os.major(dev) == 0 or not node.exists():
        raise StorageConditionUnavailable(
            f"{path} is on {filesystem_type(path)}, which has no block device to throttle"
        )
    if (node / "partition").exists():
        return (node.resolve().parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"
