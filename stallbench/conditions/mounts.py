"""What the kernel's mount table says of a path: its filesystem's type and the disk under it (the table
itself is read by ``loader.system.mounts``, for the loader and stallbench alike)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loader.system.mounts import Mount

__all__ = ["StorageConditionUnavailable", "block_device", "filesystem_type", "mounts"]


class StorageConditionUnavailable(RuntimeError):
    """A storage condition cannot be set up here; the message says what was not possible and why."""


def mounts() -> list[Mount]:
    """This process's mounts; StorageConditionUnavailable where the table cannot be read."""
    from loader.system import mounts  # here: the command line starts without loader

    with _readable():
        return mounts.mounts()


def filesystem_type(path: str | os.PathLike) -> str:
    """Type of the filesystem that holds ``path`` (ext4, xfs, tmpfs, overlay, nfs4, ...)."""
    from loader.system import mounts

    with _readable():
        return mounts.mount_of(path).fstype


@contextlib.contextmanager
def _readable() -> Iterator[None]:
    """The mount table unreadable (not Linux) is a condition that cannot be set up."""
    from loader.system.mounts import MOUNTINFO

    try:
        yield
    except OSError as e:
        raise StorageConditionUnavailable(f"cannot read {MOUNTINFO} ({e.strerror}): not Linux?") from e


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
