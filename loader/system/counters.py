"""The kernel's counts for a process tree: bytes it read from storage, and CPU seconds it used.

Storage bytes are ``read_bytes`` of ``/proc/<pid>/io``: what the kernel read from the device for the process
(device bytes: whole pages; reads the page cache served are not in it). A process's count already holds its
reaped children's, so the sum over this process and its live descendants counts every process that ever ran
in the tree, workers that have exited included; the CPU seconds are summed the same way (each live process's
user + system time, and its reaped children's). An epoch's figures are two readings subtracted.

Every part that counts storage bytes does it here: ``loader.stats.loader_stats`` (the loader's own
``storage_bytes``, per process, read cheaply: ``own_read_bytes``), stallbench's generated jobs and the
bootstrap in a user's command, and the storage reader of ``stallbench.analysis.measure``. That reader runs in
a ``python -I`` child that loads this file alone, so it imports only the standard library (psutil, which finds
a tree's processes, when a tree is read).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["cpu_seconds", "own_read_bytes", "read_bytes", "storage_read_bytes"]


def read_bytes(pid: int | str = "self") -> int:
    """The kernel's ``read_bytes`` of one process (its reaped children included)."""
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])


_proc_io: tuple[int, int] = (-1, -1)  # (pid, fd of /proc/self/io), one per process


def own_read_bytes() -> int:
    """``read_bytes`` of this process, from a descriptor kept open (a cheap read per batch); 0 where the
    kernel keeps no count."""
    global _proc_io
    if _proc_io[0] != os.getpid():
        _proc_io = (os.getpid(), os.open("/proc/self/io", os.O_RDONLY | os.O_CLOEXEC))
    for line in os.pread(_proc_io[1], 4096, 0).splitlines():
        if line.startswith(b"read_bytes:"):
            return int(line.split()[1])
    return 0


def storage_read_bytes() -> int:
    """Bytes the kernel read from storage for this process and all its descendants."""
    return sum(_each(lambda p: read_bytes(p.pid)))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and all its descendants."""
    return sum(_each(lambda p: sum(p.cpu_times()[:4])))  # user, system, reaped children's user, system


def _each(read: Callable[[Any], float]) -> Iterator[float]:
    """``read`` of each live process of the tree; one gone by then is left out (its parent counts it once
    it is reaped)."""
    import psutil

    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            yield read(proc)
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
