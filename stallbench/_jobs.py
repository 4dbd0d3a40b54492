"""Running loader jobs (``stallbench._epochs``) as subprocesses, inside kernel-enforced limits when asked.

Both loaders of a comparison get the same memory limit: the cache budget plus the memory the job itself
needs, measured here (``measure_overhead``) in a cgroup while each loader runs its first few batches.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stallbench.storage import StorageLimits, evict_page_cache, resident_bytes

__all__ = [
    "EXTRA_WORKER_MARGIN",
    "OVERHEAD_MARGIN",
    "JobFailed",
    "job_argv",
    "job_tmpdir",
    "measure_overhead",
    "memory_limit",
    "probe_cache_bytes",
    "run_job",
    "scratch_cache_dir",
]

_TAIL = 2_000  # characters of a failed job's stderr kept in the error
_SUN_PATH = 107  # bytes of a Unix socket's path (sun_path, less its NUL)
_SOCKET, _TMP_NAME = len("/pymp-XXXXXXXX/listener-XXXXXXXX"), len("/sb-XXXXXXXX")
# Headroom over the measured overhead: the kernel's own objects (inodes, page tables) and later allocations
# grow a job a few MB past its probe, and a cache in /dev/shm cannot be reclaimed, so it would meet the OOM
# killer. The margin goes to both loaders: the page cache of torch's loader gets to use it.
OVERHEAD_MARGIN = 32 << 20
# Workers beyond the cores each grow past the probe too: over a long run their copy-on-write pages of the
# parent are copied, which a probe of a few batches does not see (measured: a 4-worker job on 2 cores was
# killed at the probe's figure + 32 MiB).
EXTRA_WORKER_MARGIN = 24 << 20


class JobFailed(RuntimeError):
    """A loader job exited with an error; the message holds the end of its stderr."""


def job_argv(
    kind: str, data: str | os.PathLike, *, script: str | os.PathLike | None = None, **options: Any
) -> list[str]:
    """``python -m stallbench._epochs`` (or ``python script``) with ``--key value`` for each option set."""
    argv = [sys.executable, *([os.fspath(script)] if script else ["-m", "stallbench._epochs"])]
    argv += ["--loader", kind, "--data", os.fspath(data)]
    for key, value in options.items():
        if value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def run_job(argv: Sequence[str], limits: StorageLimits | None = None, timeout: float = 600) -> list[dict]:
    """Run a job (inside ``limits`` when given) and return its per-epoch records.

    The job gets a private ``TMPDIR``, removed when it is done: a DataLoader worker creates a ``pymp-*``
    folder there (``multiprocessing.util.get_temp_dir``, for sharing tensors) and leaves it behind when it is
    killed (an interrupted run, a cgroup's sweep) rather than let to exit.
    """
    run = limits.run if limits is not None else subprocess.run
    tmp = job_tmpdir()
    try:
        done = run(list(argv), capture_output=True, text=True, timeout=timeout, env=_job_env(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if done.returncode != 0:
        where = " inside the cgroup" if limits is not None else ""
        raise JobFailed(f"{' '.join(argv[1:4])}... exited {done.returncode}{where}:\n{done.stderr[-_TAIL:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def job_tmpdir() -> str:
    """A fresh folder for a job's ``TMPDIR``, in this one (``tempfile.gettempdir()``) or else in /tmp.

    A worker's socket goes at ``<TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX``, and a Unix socket's path has at
    most 107 bytes: a deeper one cannot be bound, the worker cannot send its batch and the job hangs."""
    bases = (tempfile.gettempdir(), "/tmp")
    fits = [base for base in bases if len(os.fsencode(base)) + _TMP_NAME + _SOCKET <= _SUN_PATH]
    return tempfile.mkdtemp(prefix="sb-", dir=fits[0] if fits else None)


def _job_env(tmpdir: str) -> dict[str, str]:
    """This environment, with this checkout importable and ``TMPDIR`` set to ``tmpdir``."""
    paths = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths)), "TMPDIR": tmpdir}


def scratch_cache_dir(parent: str | os.PathLike = "/dev/shm") -> Path:
    """A fresh private folder for one run's cache; the caller removes it (``shutil.rmtree``)."""
    return Path(tempfile.mkdtemp(prefix=f"stallbench-run-{os.getpid()}-", dir=parent))


def probe_cache_bytes(num_records: int) -> int:
    """A cache that holds its index and no record: the cached loader's probe then admits nothing."""
    from loader.cache._layout import index_bytes  # here: the command line starts without torch

    return index_bytes(num_records) + mmap.PAGESIZE


def measure_overhead(
    argv_for: Callable[[str, Path], list[str]], kinds: Sequence[str], data: str | os.PathLike
) -> dict[str, int]:
    """Memory (bytes) each kind's job needs besides its cache, measured in an unlimited cgroup.

    ``argv_for(kind, cache_dir)`` gives the probe: the real job cut to a few batches (a cached loader with
    ``probe_cache_bytes``). Its figure is the cgroup's peak less the records it left in the page cache.
    An unmeasured first run puts the interpreter's and torch's files in the page cache: no probe pays them.
    """
    peaks = {}
    for i, kind in enumerate([kinds[0], *kinds]):
        cache_dir = scratch_cache_dir()
        try:
            evict_page_cache(data)
            with StorageLimits() as limits:
                run_job(argv_for(kind, cache_dir), limits)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        if i > 0:
            peaks[kind] = limits.memory_max_usage() - resident_bytes(data, whole_pages=True)
    return peaks


def memory_limit(cache_bytes: int, overheads: dict[str, int], workers: int = 2) -> int:
    """The one limit every loader of a comparison gets: the cache budget plus the largest job overhead, and
    the memory the cached loader keeps free under that limit (it stops admitting short of it), so its cache
    can fill to the budget. The page cache of torch's loader gets to use the same memory."""
    from loader._memory import reserve_for_limit  # here: the command line starts without torch

    extra = max(0, workers - (os.cpu_count() or 1)) * EXTRA_WORKER_MARGIN
    base = cache_bytes + max(overheads.values()) + OVERHEAD_MARGIN + extra
    limit = base + reserve_for_limit(base)
    while limit - reserve_for_limit(limit) < base:  # 5% of the limit: a fixed point a step or two away
        limit = base + reserve_for_limit(limit)
    return limit
