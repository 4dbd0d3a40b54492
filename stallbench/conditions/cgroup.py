"""Kernel-enforced storage conditions for child processes: a cgroup v1 memory limit and read throttle."""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stallbench._held_signals import signals_held
from stallbench.conditions.mounts import StorageConditionUnavailable, block_device, mounts

__all__ = [
    "StorageConditionUnavailable",
    "StorageLimits",
    "controller_roots",
    "remove_cgroup",
    "try_cgroup",
]

_SETTINGS = {"memory": "memory.limit_in_bytes", "blkio": "blkio.throttle.read_bps_device"}
_counter = itertools.count()


def _controller_root(controller: str) -> Path:
    table = mounts()
    for mount in table:
        if mount.fstype == "cgroup" and controller in mount.options:
            return Path(mount.point)
    v2 = [m.point for m in table if m.fstype == "cgroup2"]
    hint = (
        f"; this machine has only cgroup v2 (at {v2[0]}), which stallbench does not drive yet" if v2 else ""
    )
    raise StorageConditionUnavailable(f"the cgroup v1 {controller!r} controller is not mounted{hint}")


def _make_cgroup(controller: str, name: str) -> Path:
    path = _controller_root(controller) / name
    try:
        path.mkdir()
    except OSError as e:
        raise StorageConditionUnavailable(
            f"cannot create cgroup {path}: {e.strerror} (needs root or a delegated cgroup)"
        ) from e
    return path


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise StorageConditionUnavailable(f"the kernel refused {value!r} in {path}: {e.strerror}") from e


def try_cgroup(controller: str, setting: str | None = None) -> str | None:
    """Make a scratch cgroup, apply ``setting`` to it, remove it: None if that worked, else the reason."""
    with signals_held():
        try:
            path = _make_cgroup(controller, f"stallbench-probe-{os.getpid()}-{next(_counter)}")
        except StorageConditionUnavailable as e:
            return str(e)
        try:
            if setting is not None:
                _write(path / _SETTINGS[controller], setting)
            return None
        except StorageConditionUnavailable as e:
            return str(e)
        finally:
            path.rmdir()


def _pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


class StorageLimits:
    """A fresh cgroup (memory and blkio, v1) for child processes; removed with all its processes on exit.

    ``memory_limit`` caps memory including the page cache; ``storage_bandwidth`` throttles reads (bytes per
    second) from the disk that holds ``device_path``: the fields of ``limits.Limits``, which makes this cgroup
    for a run (``Limits.cgroup``). Either may be None (no limit; the cgroup still counts).
    The cgroup does not evict what is already cached: call ``evict_page_cache`` first for a cold run.
    """

    def __init__(
        self,
        *,
        memory_limit: int | None = None,
        storage_bandwidth: int | None = None,
        device_path: str | os.PathLike = ".",
        kill_timeout: float = 5.0,
    ) -> None:
        for name, value in (("memory_limit", memory_limit), ("storage_bandwidth", storage_bandwidth)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        self.memory_limit, self.storage_bandwidth = memory_limit, storage_bandwidth
        self.kill_timeout = kill_timeout
        self.device_path = Path(device_path)
        self.device: str | None = None
        self._dirs: dict[str, Path] = {}
        self._missing: dict[str, str] = {}
        self._children: list[subprocess.Popen] = []
        self._final: dict[str, int] = {}

    def __enter__(self) -> StorageLimits:
        try:
            with signals_held():  # a stop between a cgroup's mkdir and its noting would leave it
                self._create()
        except BaseException:  # a stop held meanwhile raises here, as the block ends: removed all the same
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        self._missing, self._children, self._final = {}, [], {}
        try:
            self.device = block_device(self.device_path)
        except StorageConditionUnavailable as e:
            if self.storage_bandwidth is not None:
                raise
            self._missing["blkio"] = str(e)
        name = f"stallbench-{os.getpid()}-{next(_counter)}"
        for controller, limit in (("memory", self.memory_limit), ("blkio", self.storage_bandwidth)):
            try:
                self._dirs[controller] = _make_cgroup(controller, name)
            except StorageConditionUnavailable as e:
                if limit is not None:
                    raise
                self._missing.setdefault(controller, str(e))
        if not self._dirs:
            raise StorageConditionUnavailable("; ".join(self._missing.values()))
        if self.memory_limit is not None:
            _write(self._dirs["memory"] / _SETTINGS["memory"], str(self.memory_limit))
        if self.storage_bandwidth is not None:
            _write(self._dirs["blkio"] / _SETTINGS["blkio"], f"{self.device} {self.storage_bandwidth}")

    def readable_in(self, seconds: float) -> int | None:
        """The bytes the read throttle lets through in ``seconds``; None without a throttle."""
        return None if self.storage_bandwidth is None else round(seconds * self.storage_bandwidth)

    @property
    def paths(self) -> list[Path]:
        """The cgroup directories, while active."""
        return list(self._dirs.values())

    def popen(self, argv: Sequence[str | os.PathLike], **popen_kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside the cgroup (a ``/bin/sh`` shim joins it, then execs ``argv``)."""
        if not self._dirs:
            raise RuntimeError("StorageLimits is not active: use it as `with StorageLimits(...) as limits:`")
        if popen_kwargs.get("shell"):
            raise ValueError("shell=True is not supported: pass an argv list")
        join = " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self._dirs.values())
        shim = ["/bin/sh", "-c", f'{join} || exit 125; exec "$@"', "stallbench-cgroup"]
        proc = subprocess.Popen(shim + [os.fspath(a) for a in argv], **popen_kwargs)
        self._children.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str | os.PathLike],
        *,
        input: Any = None,
        timeout: float | None = None,
        check: bool = False,
        capture_output: bool = False,
        **popen_kwargs: Any,
    ) -> subprocess.CompletedProcess:
        """Like ``subprocess.run``, inside the cgroup. Exit status 125 means the child could not join it."""
        if capture_output:
            popen_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if input is not None:
            popen_kwargs.setdefault("stdin", subprocess.PIPE)
        with self.popen(argv, **popen_kwargs) as proc:
            try:
                out, err = proc.communicate(input, timeout=timeout)
            except BaseException:
                proc.kill()
                raise
        done = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check:
            done.check_returncode()
        return done

    def read_bytes(self) -> int:
        """Bytes this cgroup read from the throttled disk, as the kernel's block layer counted them."""
        return self._stat("read_bytes", "blkio")

    def memory_max_usage(self) -> int:
        """Peak memory (including page cache) charged to this cgroup."""
        return self._stat("memory_max_usage", "memory")

    def memory_failcnt(self) -> int:
        """How many times this cgroup hit its memory limit."""
        return self._stat("memory_failcnt", "memory")

    def oom_kills(self) -> int:
        """How many processes of this cgroup the kernel killed for want of memory."""
        return self._stat("oom_kills", "memory")

    def set_memory_limit(self, limit: int) -> None:
        """Move the memory limit while the cgroup's processes run: the kernel reclaims what it can to meet a
        lower one, and refuses it (StorageConditionUnavailable) where it cannot."""
        if "memory" not in self._dirs:
            raise RuntimeError("StorageLimits has no active memory cgroup")
        _write(self._dirs["memory"] / _SETTINGS["memory"], str(limit))
        self.memory_limit = limit

    def _stat(self, key: str, controller: str) -> int:
        """A counter, live while active and as it was at close afterwards."""
        stats = self._read_stats() if self._dirs else self._final
        if key not in stats:
            reason = self._missing.get(controller, "StorageLimits was never entered")
            raise StorageConditionUnavailable(f"{key} is not counted: {reason}")
        return stats[key]

    def _read_stats(self) -> dict[str, int]:
        stats = {}
        if "blkio" in self._dirs and self.device is not None:
            rows = (self._dirs["blkio"] / "blkio.throttle.io_service_bytes").read_text().splitlines()
            stats["read_bytes"] = sum(
                int(r[2]) for r in map(str.split, rows) if r[:2] == [self.device, "Read"]
            )
        if "memory" in self._dirs:
            for key, file in (("memory_max_usage", "max_usage_in_bytes"), ("memory_failcnt", "failcnt")):
                stats[key] = int((self._dirs["memory"] / f"memory.{file}").read_text())
            oom = (self._dirs["memory"] / "memory.oom_control").read_text().split()
            stats["oom_kills"] = int(oom[oom.index("oom_kill") + 1]) if "oom_kill" in oom else 0
        return stats

    def close(self) -> None:
        """Kill every process left in the cgroup and remove it; a stop meanwhile acts once that is done."""
        with signals_held():
            self._remove()

    def _remove(self) -> None:
        if self._dirs and not self._final:
            self._final = self._read_stats()
        deadline = time.monotonic() + self.kill_timeout
        for proc in self._children:  # first, so that no shim can join the cgroup after the sweep below
            proc.kill()
            proc.wait(max(0.0, deadline - time.monotonic()))
        while pids := sorted({p for d in self._dirs.values() for p in _pids(d)}):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {pids} in {list(self._dirs.values())} survived SIGKILL")
            time.sleep(0.005)
        for controller, path in list(self._dirs.items()):
            remove_cgroup(path, deadline)
            del self._dirs[controller]


def controller_roots() -> list[Path]:
    """Where the cgroup v1 controllers stallbench uses are mounted (those that are)."""
    ours = set(_SETTINGS)
    mounted = {c: m.point for m in mounts() if m.fstype == "cgroup" for c in m.options & ours}
    return [Path(mounted[c]) for c in _SETTINGS if c in mounted]


def remove_cgroup(path: Path, deadline: float) -> None:
    """Remove the cgroup ``path`` once empty (its last processes may still be leaving it), by ``deadline``."""
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
