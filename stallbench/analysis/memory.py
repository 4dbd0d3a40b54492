"""The memory limit of a comparison: the same for every loader, sized from what each job itself needs.

Both loaders of a comparison get the same memory limit: the cache budget plus the memory the job itself
needs, measured here (``measure_overhead``) in a cgroup while each loader runs its first few batches; a
generated job and the user's own command alike (``sized_memory``: each job runs its own probe).
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from stallbench.analysis.runs import Job
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import AUTO
from stallbench.conditions.storage import evict_page_cache, resident_bytes
from stallbench.jobs.run import scratch_cache_dir

__all__ = [
    "EXTRA_WORKER_MARGIN",
    "OVERHEAD_MARGIN",
    "measure_overhead",
    "memory_limit",
    "probe_cache_bytes",
    "sized_memory",
]

PREFETCH = 2  # torch's default prefetch_factor: batches each worker keeps ready
PROBE_BATCHES = 10  # the fewest batches of a memory probe: 4 workers' queues full
# Headroom over the measured overhead: the kernel's own objects (inodes, page tables) and later allocations
# grow a job a few MB past its probe, and a cache in /dev/shm cannot be reclaimed, so it would meet the OOM
# killer. The margin goes to both loaders: the page cache of torch's loader gets to use it.
OVERHEAD_MARGIN = 32 << 20
# Workers beyond the cores each grow past the probe too: over a long run their copy-on-write pages of the
# parent are copied, which a probe of a few batches does not see (measured: a 4-worker job on 2 cores was
# killed at the probe's figure + 32 MiB).
EXTRA_WORKER_MARGIN = 24 << 20


def probe_batches(workers: int | None) -> int:
    """Batches of each loader a memory probe runs, for a generated workload and a command alike: every
    worker's prefetch queue full (torch's ``prefetch_factor`` 2), as in a run; at least ``PROBE_BATCHES``,
    the whole rule where the workers are not known before the command runs."""
    return max(PROBE_BATCHES, PREFETCH * (workers or 0) + 2)


def probe_cache_bytes(num_records: int) -> int:
    """A cache that holds its index and no record: the cached loader's probe then admits nothing."""
    from loader.instrument import index_bytes  # here: the command line starts without torch

    return index_bytes(num_records) + mmap.PAGESIZE


ProbeRun = Callable[[str, Path, StorageLimits], Any]


def measure_overhead(
    run_probe: ProbeRun, kinds: Sequence[str], data: str | os.PathLike | Iterable[str | os.PathLike]
) -> dict[str, int]:
    """Memory (bytes) each kind's job needs besides its cache, measured in an unlimited cgroup.

    ``run_probe(kind, cache_dir, limits)`` runs the probe inside ``limits``: the real job cut to a few
    batches (a cached loader with ``probe_cache_bytes`` in ``cache_dir``). Its figure is the cgroup's peak
    less the files of ``data`` it left in the page cache. An unmeasured first run puts the interpreter's and
    torch's files in the page cache: no probe pays them.
    """
    peaks = {}
    for i, kind in enumerate([kinds[0], *kinds]):
        cache_dir = scratch_cache_dir()
        try:
            evict_page_cache(data)
            with StorageLimits() as limits:
                run_probe(kind, cache_dir, limits)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        if i > 0:
            peaks[kind] = limits.memory_max_usage() - resident_bytes(data, whole_pages=True)
    return peaks


def memory_limit(cache_bytes: int, overheads: dict[str, int], workers: int = 2) -> int:
    """The one limit every loader of a comparison gets: the cache budget plus the largest job overhead, and
    the memory the cached loader keeps free under that limit (it stops admitting short of it), so its cache
    can fill to the budget. The page cache of torch's loader gets to use the same memory."""
    from loader.system import reserve_for_limit  # here: the command line starts without torch

    extra = max(0, workers - (os.cpu_count() or 1)) * EXTRA_WORKER_MARGIN
    own = max(overheads.values()) + OVERHEAD_MARGIN + extra
    base = cache_bytes + own
    limit = base + reserve_for_limit(base, own)
    while limit - reserve_for_limit(limit, own) < base:  # 5% of the limit: a fixed point a step or two away
        limit = base + reserve_for_limit(limit, own)
    return limit


def sized_memory(job: Job, kinds: Sequence[str], log: IO[str] | None = None) -> Job:
    """``--memory-limit auto``, for every job: the cache budget plus the most memory the job needs with any
    of the loaders ``kinds`` (each run as its probe, ``Job.memory_probe``), and the margins of
    ``memory_limit`` for as many workers as the probes ran. A job whose limit is not ``auto`` as it is."""
    if job.limits.memory_limit != AUTO:
        return job
    workers: list[int] = []

    def probe(kind: str, cache_dir: Path, limits: StorageLimits) -> None:
        workers.extend(job.memory_probe(kind, cache_dir, limits, log))

    read = list(dict.fromkeys(os.fspath(path) for kind in kinds for path in job.read_by(kind)))  # each once
    overheads = measure_overhead(probe, kinds, read)
    return job.sized(memory_limit(job.cache_bytes or 0, overheads, max(workers, default=0)))
