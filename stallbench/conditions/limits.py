"""The limits a cold run asks the kernel for, ``--storage-bandwidth`` and ``--memory-limit``, as one value
(:class:`Limits`) from the command line to the cgroup that enforces them (``cgroup.StorageLimits``) and the
report that states them; and whether this machine can enforce them (``probe_storage_conditions``).

Every other module hands the value on whole: a new limit is a field here, a cgroup setting and a flag.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

from stallbench.conditions.cgroup import StorageConditionUnavailable, StorageLimits, try_cgroup
from stallbench.conditions.mounts import block_device, filesystem_type
from stallbench.conditions.sizes import format_bytes

__all__ = ["AUTO", "NONE", "Limits", "probe_storage_conditions"]

PathArg = str | os.PathLike
AUTO = "auto"  # --memory-limit auto: the cache budget plus the job's measured memory
_PYTHON_STARTS_WITHIN = 30.0  # seconds a bare Python process takes at most to start under a memory limit
_MEMORY_FS = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"}


@dataclass(frozen=True)
class Limits:
    """``storage_bandwidth``: reads from the data's disk, bytes per second; ``memory_limit``: bytes per job
    (page cache included), or :data:`AUTO` until the job's measured memory sizes it. None: no such limit."""

    storage_bandwidth: int | None = None
    memory_limit: int | str | None = None

    def options(self) -> list[str]:
        """The options that asked for a limit, as a user typed them (``["--storage-bandwidth"]``)."""
        return ["--" + name.replace("_", "-") for name, value in self._asked().items() if value is not None]

    def known(self) -> dict[str, int | None]:
        """The limits as a run's record states them: :data:`AUTO` not yet sized is None."""
        return {name: None if value == AUTO else value for name, value in self._asked().items()}

    def sized(self, memory_limit: int) -> Limits:
        """These limits with ``--memory-limit auto`` sized to ``memory_limit`` bytes."""
        return dataclasses.replace(self, memory_limit=memory_limit)

    def said(self, unset: bool = True) -> list[str]:
        """Each limit in words; ``unset``: the ones not asked for too (``"storage not throttled"``)."""
        words = [
            f"storage reads throttled to {format_bytes(self.storage_bandwidth)}/s"
            if self.storage_bandwidth is not None
            else "storage not throttled",
            "memory not limited"
            if self.memory_limit is None
            else "memory limited to the cache budget plus the job's measured memory, for each loader"
            if self.memory_limit == AUTO
            else f"memory limited to {format_bytes(self.memory_limit)}",
        ]
        return words if unset else [w for w in words if " not " not in w]

    def check(self, data: PathArg, cold: bool, over_network: bool = False) -> None:
        """Raise ``StorageConditionUnavailable`` naming the option this machine cannot enforce for ``data``
        (and the page cache eviction a ``cold`` run needs). ``over_network``: ``data`` is fetched over the
        network (object storage), which neither a disk's throttle nor the page cache sees."""
        if over_network and self.storage_bandwidth is not None:
            raise StorageConditionUnavailable(
                f"--storage-bandwidth throttles a disk, and {data} comes over the network: measure it at the "
                "network's own rate (or throttle the link itself, e.g. tc on its interface)"
            )
        if over_network:
            data, cold = ".", False  # a memory limit alone: no file of the data to probe or evict
        problems = probe_storage_conditions(data)
        for name, asked in self._asked().items():
            if asked is not None and problems[name] is not None:
                option = "--" + name.replace("_", "-")
                raise StorageConditionUnavailable(f"{option} cannot be enforced here: {problems[name]}")
        if cold and problems["page_cache_eviction"] is not None:
            raise StorageConditionUnavailable(
                f"the cold run cannot evict the page cache: {problems['page_cache_eviction']}"
            )
        if isinstance(self.memory_limit, int):
            _check_python_fits(self.memory_limit)

    def cgroup(self, device_path: PathArg) -> StorageLimits | None:
        """The cgroup that enforces these limits on reads from the disk of ``device_path``; None for none."""
        asked = self.known()
        if all(value is None for value in asked.values()):
            return None
        return StorageLimits(**asked, device_path=device_path)

    def _asked(self) -> dict[str, int | str | None]:
        return dataclasses.asdict(self)


NONE = Limits()  # no limit asked for


def _eviction_problem(path: PathArg) -> str | None:
    if not hasattr(os, "posix_fadvise"):
        return "os.posix_fadvise is not available on this platform"
    fstype = filesystem_type(path)
    return f"{path} is on {fstype}, which keeps files only in memory" if fstype in _MEMORY_FS else None


def _throttle_problem(path: PathArg) -> str | None:
    try:
        device = block_device(path)
    except StorageConditionUnavailable as e:
        return str(e)
    return try_cgroup("blkio", f"{device} {1 << 30}")


def _check_python_fits(memory_limit: int) -> None:
    """``StorageConditionUnavailable`` where the kernel kills a bare Python process under ``memory_limit``:
    said before any run, not found as the cold run's kill after the others."""
    limits = StorageLimits(memory_limit=memory_limit)
    argv = [sys.executable, "-I", "-c", "import json, os"]
    try:
        with limits:
            done = limits.run(argv, capture_output=True, timeout=_PYTHON_STARTS_WITHIN)
    except subprocess.TimeoutExpired:  # swapped rather than killed: as unusable
        killed = False
    else:
        killed = done.returncode == -signal.SIGKILL
        if not killed:
            return
    happened = (
        "the kernel killed a bare Python process under it"
        if killed
        else f"a bare Python process did not start within {_PYTHON_STARTS_WITHIN:.0f} s under it"
    )
    raise StorageConditionUnavailable(
        f"--memory-limit {format_bytes(memory_limit)} is too small: {happened}; give the job the memory it "
        "needs besides the cache (stallbench measures it with --memory-limit auto)"
    )


def probe_storage_conditions(path: PathArg = ".") -> dict[str, str | None]:
    """Which conditions can be set up here for data under ``path``: None if possible, else the reason.

    Keys: ``page_cache_eviction`` and each field of :class:`Limits`. The cgroup ones are tried for real on a
    scratch cgroup that is removed again.
    """
    probes = {
        "page_cache_eviction": lambda: _eviction_problem(path),
        "memory_limit": lambda: try_cgroup("memory", str(1 << 30)),
        "storage_bandwidth": lambda: _throttle_problem(path),
    }
    try:
        return {name: probe() for name, probe in probes.items()}
    except StorageConditionUnavailable as e:  # no mount table at all
        return dict.fromkeys(probes, str(e))
