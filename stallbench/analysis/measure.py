"""Machine figures an analysis needs, measured here and now, never assumed.

* storage bandwidth: a random sample of the dataset's files read whole, in random order, by as many readers
  as the job has workers, from a cold page cache (inside the run's ``StorageLimits`` when given, so a kernel
  throttle applies), in device bytes per second: the bytes the kernel read, as a job's storage bytes are;
* memory bandwidth: bytes per second of a numpy copy, best of a few.

The prep rate is not measured here: the runs count the CPU prep takes
(``stallbench.analysis.loader_report.measured_machine``), for a generated job and a user's Dataset alike.

The storage reader always runs in a fresh ``python -I`` child that imports nothing but the standard
library and ``loader.system.counters`` (standard library only: the kernel's count of the bytes it read), so
that a memory limit is spent on the page cache, not on torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from stallbench.conditions.cgroup import StorageConditionUnavailable, StorageLimits
from stallbench.conditions.sizes import format_bytes
from stallbench.conditions.storage import device_bytes, evict_page_cache, files_in

__all__ = [
    "available_cores",
    "measure_bandwidths",
    "measure_memory_bandwidth",
    "measure_storage_bandwidth",
]

PathArg = str | os.PathLike
_PROBE_BYTES, _PROBE_SECONDS = 128 << 20, 4  # the storage probe reads at most this, or this long throttled
_READER = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor

def read(path):
    with open(path, "rb", buffering=0) as f:
        return len(f.readall())

job = json.load(sys.stdin)
sys.path.insert(0, job["loader_root"])  # -I: the folder that holds the loader package, as the parent found it
from loader.system.counters import read_bytes as kernel_reads
before, start = kernel_reads(), time.perf_counter()
with ThreadPoolExecutor(job["readers"]) as pool:
    total = sum(pool.map(read, job["files"]))
seconds = time.perf_counter() - start
print(json.dumps({"device_bytes": kernel_reads() - before, "record_bytes": total, "seconds": seconds}))
"""


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0))


def _sample_files(paths: PathArg | Iterable[PathArg], sample_bytes: int, seed: int) -> list[str]:
    """Files of ``paths`` in a random order, as many as it takes to reach ``sample_bytes``."""
    files = list(files_in(paths))
    random.Random(seed).shuffle(files)
    sample, total = [], 0
    for path in files:
        if total >= sample_bytes:
            break
        sample.append(path)
        total += os.path.getsize(path)
    if total == 0:
        raise ValueError(f"no bytes to read: the files of {paths!r} are empty or missing")
    return sample


def _read_files(files: list[str], readers: int, limits: StorageLimits | None) -> dict[str, Any]:
    """Run ``_READER`` on ``files`` in a child, inside ``limits`` (entered here unless active): the kernel's
    count of the bytes it read, the files' bytes and the seconds it took."""
    argv = [sys.executable, "-I", "-c", _READER]
    import loader.system.counters  # here: the command line starts without loader

    root = str(Path(loader.system.counters.__file__).parents[2])
    feed = json.dumps({"files": files, "readers": readers, "loader_root": root})
    if limits is None:
        done = subprocess.run(argv, input=feed, capture_output=True, text=True, check=False)
    else:
        with contextlib.nullcontext(limits) if limits.paths else limits:
            done = limits.run(argv, input=feed, capture_output=True, text=True)
    if done.returncode == -signal.SIGKILL and limits is not None and limits.memory_limit is not None:
        raise StorageConditionUnavailable(
            f"--memory-limit {format_bytes(limits.memory_limit)} is too small: the kernel killed the storage "
            "reader, a bare Python process that reads the data, under it; give the job the memory it needs "
            "besides the cache (stallbench measures it with --memory-limit auto)"
        )
    if done.returncode != 0:
        raise RuntimeError(f"the storage reader exited with {done.returncode}: {done.stderr[-800:]}")
    return json.loads(done.stdout)


def measure_storage_bandwidth(
    paths: PathArg | Iterable[PathArg],
    *,
    sample_bytes: int = 128 << 20,
    limits: StorageLimits | None = None,
    seed: int = 0,
    readers: int = 1,
) -> float:
    """Device bytes/s of cold whole-file reads of a random sample of ``paths`` (directories walked).

    The sample is evicted from the page cache before and again after, so a cold run that follows starts
    cold. The files are read whole, in random order, by ``readers`` threads of a child process (inside
    ``limits`` when given). The bytes are the kernel's count of what the child read from the device
    (``loader.system.counters``: whole pages, as a job's storage bytes are counted); where the kernel
    counts none (storage outside the block layer), the files' sizes rounded up to whole pages.
    """
    _check_positive_int("sample_bytes", sample_bytes)
    _check_positive_int("readers", readers)
    files = _sample_files(paths, sample_bytes, seed)
    evict_page_cache(files)
    try:
        result = _read_files(files, readers, limits)
    finally:
        evict_page_cache(files)
    counted = result["device_bytes"] or sum(device_bytes(os.path.getsize(path)) for path in files)
    return counted / result["seconds"]


def measure_memory_bandwidth(nbytes: int = 256 << 20, *, repeats: int = 3) -> float:
    """Bytes/s copied by ``numpy.copyto`` of ``nbytes`` (each byte read once and written once), best run."""
    _check_positive_int("nbytes", nbytes)
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros_like(src)  # zeros: the pages are touched now, not inside the first timed copy
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def measure_bandwidths(
    paths: PathArg | Iterable[PathArg], *, limits: StorageLimits | None = None, readers: int = 1
) -> tuple[float, float]:
    """(storage, memory) bytes per second; storage read by ``readers`` threads (a job's workers read at
    once) inside ``limits``: 128 MB at most, or a few seconds' worth under a read throttle."""
    sample = _PROBE_BYTES
    throttled = limits.readable_in(_PROBE_SECONDS) if limits is not None else None
    if throttled is not None:
        sample = min(sample, max(throttled, 1 << 20))
    storage = measure_storage_bandwidth(paths, limits=limits, readers=readers, sample_bytes=sample)
    return storage, measure_memory_bandwidth()
