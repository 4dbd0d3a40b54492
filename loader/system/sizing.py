"""How big a cache may be, from the memory view (``memory.py``): the reserve it leaves free for the job's own
growth, the size ``cache_bytes="auto"`` gives it, a number lowered to what the job can spare, and the room
on the cache's filesystem. Decided when the cache is made; what it may take while the job runs is the
gauge's (``headroom.py``)."""

from __future__ import annotations

import os
import warnings

from loader.system import memory as _memory
from loader.system.memory import MemoryView, format_bytes

__all__ = ["auto_cache_bytes", "disk_room", "reserve_bytes", "reserve_for_limit", "sized_cache_bytes"]

_MIB = 1 << 20
_DISK_MARGIN = 1 << 30  # what a cache leaves free on its filesystem (or a 20th of it, where that is less)
_LIMIT_SHARE, _OWN_SHARE = 20, 5  # a 20th of the limit; a 5th of the job's own memory: see reserve_for_limit
_OWN_FLOOR, _OWN_CAP = 16 * _MIB, 128 * _MIB


def reserve_bytes(view: MemoryView) -> int:
    """Memory to leave free for the job's own growth (``reserve_for_limit``), all the usage under the view's
    limit being the job's own (no store made yet)."""
    return reserve_for_limit(view.limit, view.limit - view.headroom)


def reserve_for_limit(limit: int, own: int) -> int:
    """What the cache leaves free under a memory limit of ``limit`` bytes for a job whose own memory (the
    cache not counted) is ``own`` bytes: 5% of the limit, or a fifth of the job's own memory (at least
    16 MiB, at most 128 MiB) where that is more.

    The growth is mostly copy-on-write and comes at once, faster than any look at the memory: a DataLoader
    worker shares its parent's pages when forked and copies each one it writes to (a refcount is a write), so
    the job grows each time workers are forked, by a share of its own size. Measured with the heap frozen
    while workers fork (``loader/transport/shared_heap.py``): an evaluation loader's 2 workers forked from a
    288 MiB job grew it by ~50 MiB. Below 2.5 GiB the fifth of the job binds, so a small job under a tight
    limit keeps little free, and a big one no more than 128 MiB; above, 5% of the limit. Where the job grows
    through the reserve anyway, the store gives memory back (``PressureGauge.overdrawn``)."""
    own_share = min(_OWN_CAP, max(_OWN_FLOOR, own // _OWN_SHARE))
    return max(limit // _LIMIT_SHARE, own_share)


def auto_cache_bytes(
    wanted: int, view: MemoryView | None = None, cache_dir: str | os.PathLike | None = None
) -> tuple[int, str]:
    """Bytes to give the cache: ``wanted``, within the headroom less the reserve (and the space free in
    ``cache_dir``, where given); and a sentence why."""
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
        raise ValueError(f"wanted must be a non-negative int, got {wanted!r}")
    view = _memory.memory_view() if view is None else view
    reserve = reserve_bytes(view)
    chosen = max(0, min(wanted, view.headroom - reserve))
    free = f"{format_bytes(view.headroom)} free per {view.source}"
    disk = disk_room(cache_dir) if cache_dir is not None else chosen
    if disk < chosen:
        return disk, f"{format_bytes(disk)}: the space free in {cache_dir}, less {format_bytes(_DISK_MARGIN)}"
    if chosen == wanted:
        return chosen, f"{format_bytes(chosen)}: the dataset's size, within {free}"
    return chosen, f"{format_bytes(chosen)}: {free}, less {format_bytes(reserve)} kept free"


def sized_cache_bytes(
    cache_bytes: int | str, wanted: int, cache_dir: str | os.PathLike, view: MemoryView | None = None
) -> tuple[int, str]:
    """(the bytes a cache in ``cache_dir`` gets, how they were chosen): for ``"auto"``, ``wanted`` (the
    records' size) within what the job can spare (``auto_cache_bytes``); for a number, that number, or what
    the job can spare where the number is more, with one warning naming both (a store larger than the
    memory the job leaves only holds pages the kernel must take back, or, in a tmpfs, gets the job killed).
    """
    if cache_bytes == "auto":
        return auto_cache_bytes(wanted, view, cache_dir)
    room, why = auto_cache_bytes(cache_bytes, view, cache_dir)
    if room == cache_bytes:
        return cache_bytes, ""
    sizing = f"cache_bytes={cache_bytes} ({format_bytes(cache_bytes)}) lowered to {why}"
    warnings.warn(f"{sizing}: the cache holds no more than the job can spare", RuntimeWarning, stacklevel=4)
    return room, sizing


def disk_room(cache_dir: str | os.PathLike) -> int:
    """The bytes a cache may still take on the filesystem of ``cache_dir``: its free space less 1 GiB, or
    less a 20th of the filesystem where that is less; unbounded where the filesystem will not say."""
    try:
        fs = os.statvfs(cache_dir)
    except OSError:
        return 1 << 62
    margin = min(_DISK_MARGIN, fs.f_blocks * fs.f_frsize // 20)
    return max(0, fs.f_bavail * fs.f_frsize - margin)
