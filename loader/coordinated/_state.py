"""The group's shared table: a header, one row per member, one slot per staged batch, in one mmap'ed file.

Batches are numbered across epochs: batch ``b`` of epoch ``e`` is ``g = e * B + b``. At most two epochs are
in flight at once (the window is at most ``B`` batches), so slot ``g % (2 * B)`` holds ``g``'s state.
Rows and slots change only under the group's lock; a reader outside it sees a value a writer stored whole.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

__all__ = [
    "ACTIVE",
    "CLAIMED",
    "DETACHED",
    "EMPTY",
    "FAILED",
    "FREE",
    "MAX_MEMBERS",
    "PENDING",
    "READY",
    "UNCLAIMED",
    "State",
]

MAGIC, VERSION, MAX_MEMBERS = b"SBGROUP1", 2, 64
EMPTY, ACTIVE, PENDING, DETACHED = 0, 1, 2, 3  # a member's status
FREE, UNCLAIMED, CLAIMED, READY, FAILED = 0, 1, 2, 3, 4  # a slot's state

HEADER = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("num_batches", "<u4"),
        ("window", "<u4"),
        ("pad", "<u4"),
        ("published", "<i8"),
        ("pad2", "<i8", 4),
    ]
)
MEMBER = np.dtype(
    [
        ("status", "<u4"),
        ("pid", "<i4"),
        ("writer", "<u4"),
        ("gen", "<u4"),
        ("position", "<i8"),
        ("prepared", "<i8"),
        ("consumed", "<i8"),
        ("prep_cpu", "<f8"),
        ("cpu_saved", "<f8"),
    ]
)
SLOT = np.dtype(
    [
        ("g", "<i8"),
        ("state", "<u4"),
        ("writer", "<u4"),
        ("gen", "<u4"),
        ("member", "<i4"),
        ("nbytes", "<i8"),
        ("cpu", "<f8"),
        ("claimed_at", "<f8"),
    ]
)  # claimed_at: time.monotonic() (CLOCK_MONOTONIC, one clock for every process of the machine)


class State:
    """The arrays of the ``state`` file open as ``fd`` (mapped shared; the caller keeps ``fd``)."""

    def __init__(self, fd: int, num_batches: int, window: int) -> None:
        size = _size(num_batches)
        self.fresh = os.fstat(fd).st_size != size
        if self.fresh:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, size)
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.header = np.frombuffer(self._map, HEADER, 1)[0:1]
        self.members = np.frombuffer(self._map, MEMBER, MAX_MEMBERS, HEADER.itemsize)
        self.slots = np.frombuffer(
            self._map, SLOT, 2 * num_batches, HEADER.itemsize + MEMBER.itemsize * MAX_MEMBERS
        )
        if self.fresh or bytes(self.header["magic"][0]) != MAGIC or int(self.header["version"][0]) != VERSION:
            self.reset(num_batches, window)
        self.num_batches = int(self.header["num_batches"][0])
        self.window = int(self.header["window"][0])

    def reset(self, num_batches: int, window: int) -> None:
        """Start over: no members, no epoch, every slot free."""
        self.members[:] = np.zeros(1, MEMBER)
        self.slots[:] = np.zeros(1, SLOT)
        self.slots["g"] = -1
        self.header["num_batches"], self.header["window"] = num_batches, window
        self.header["published"] = -1
        self.header["version"], self.header["magic"] = VERSION, MAGIC

    @property
    def published(self) -> int:
        """The last epoch whose order is out (-1: none yet)."""
        return int(self.header["published"][0])

    def slot(self, g: int) -> np.ndarray:
        return self.slots[g % len(self.slots)]

    def floor(self) -> int:
        """The lowest batch a subscribed (active or pending) member has yet to consume (huge if none)."""
        rows = self.members[self.subscribed()]
        return int(rows["position"].min()) if len(rows) else 1 << 62

    def subscribed(self) -> np.ndarray:
        """Which rows the group keeps batches for: its active members and those waiting to join."""
        return (self.members["status"] == ACTIVE) | (self.members["status"] == PENDING)

    def live_rows(self) -> list[int]:
        return [int(m) for m in np.flatnonzero(self.members["status"] != EMPTY)]

    def close(self) -> None:
        del self.header, self.members, self.slots
        self._map.close()


def _size(num_batches: int) -> int:
    return HEADER.itemsize + MEMBER.itemsize * MAX_MEMBERS + SLOT.itemsize * 2 * num_batches
