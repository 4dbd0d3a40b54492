"""``compare --jobs N``: N copies of one generated job at once per loader kind, as a hyper-parameter search
runs them on one machine. Ours form one group and prepare each batch once (``coordinate=``); torch's are N
independent loaders, each preparing every batch.

Every job of a loader gets the same data, workers, batch size, transform, epochs, compute model and seed. The
data is read into the page cache before each loader's jobs start: the comparison is of prep, not storage.
The cached kind's N jobs share one cache folder, as jobs on one machine share ``/dev/shm``.

Aggregate samples/s is all N jobs' samples over the wall time from the start of the first job's first epoch
to the end of the last job's last epoch, as the jobs read them on the machine's one monotonic clock: process
start-up, imports and the dataset's listing are left out; a coordinated job's wait for its group is in.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from stallbench.analysis.phases import RunPlan, files_read
from stallbench.analysis.request import local_files
from stallbench.analysis.training import train_epochs
from stallbench.conditions.storage import warm_page_cache
from stallbench.jobs.command import StartedCommand
from stallbench.jobs.kinds import KINDS
from stallbench.jobs.run import JobFailed, scratch_cache_dir
from stallbench.jobs.spec import JobSpec, LoaderEpoch, WorkloadJob

__all__ = ["ConcurrentRun", "JobRun", "group_name", "job_run", "run_concurrent"]

_POLL = 0.05  # seconds between looks at the running jobs
_groups = itertools.count(1)


@dataclass(frozen=True)
class JobRun:
    """One of a loader's N jobs, as the bootstrap measured it (its training loader's epoch records)."""

    job: int  # 1..N
    epoch_seconds: tuple[float, ...]
    cpu_seconds: tuple[float, ...]  # per epoch: user + system of the job's processes, main and workers
    samples: int  # over all its epochs
    batches: int
    start_time: float  # its first epoch's start, time.monotonic()
    end_time: float  # its last epoch's end
    coordination: dict[str, Any] | None = None  # ours in a group: loader.CoordinationStats at the end

    @property
    def mean_epoch_seconds(self) -> float:
        return fmean(self.epoch_seconds)

    @property
    def mean_cpu_seconds(self) -> float:
        return fmean(self.cpu_seconds)


@dataclass(frozen=True)
class ConcurrentRun:
    """One loader kind's N jobs, run at once."""

    loader: str
    jobs: tuple[JobRun, ...]

    @property
    def samples(self) -> int:
        return sum(j.samples for j in self.jobs)

    @property
    def wall_seconds(self) -> float:
        """From the first job's first epoch start to the last job's last epoch end."""
        return max(j.end_time for j in self.jobs) - min(j.start_time for j in self.jobs)

    @property
    def samples_per_s(self) -> float:
        """All jobs' samples over :attr:`wall_seconds` (NaN for an empty window)."""
        wall = self.wall_seconds
        return self.samples / wall if wall > 0 else math.nan


def job_run(job: int, records: Sequence[LoaderEpoch]) -> JobRun:
    """Job number ``job``'s training loader's epochs (in order) as a JobRun."""
    if not records:
        raise JobFailed(f"job {job} finished no epoch")
    return JobRun(
        job=job,
        epoch_seconds=tuple(r.seconds for r in records),
        cpu_seconds=tuple(r.cpu_seconds for r in records),
        samples=sum(r.samples for r in records),
        batches=sum(r.batches for r in records),
        start_time=records[0].start_time,
        end_time=records[-1].end_time,
        coordination=records[-1].stats.get("coordination"),
    )


def group_name() -> str:
    """A group name no other compare run uses: this process's pid and a count."""
    return f"stallbench-compare-{os.getpid()}-{next(_groups)}"


def run_concurrent(
    plan: RunPlan,
    kinds: Sequence[str],
    jobs: int,
    on_step: Callable[[str], None] | None = None,
    timeout: float = 600,
) -> Iterator[ConcurrentRun]:
    """Each loader kind's ``jobs`` jobs at once, one kind after the other; each yielded as soon as its jobs
    are done (an interrupted compare keeps the finished ones). ``timeout``: seconds one kind's jobs may take.
    Ctrl-C or a failed job kills every job of the kind (each in a session of its own) before it propagates.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs!r}")
    for kind in kinds:
        if KINDS[kind].converts and not local_files(plan.workload.data):
            from stallbench.jobs.others import convert  # here: it loads torch

            convert(plan.workload.data, kind)  # its copy in the bucket (analyze's is made by opened())
        warm_page_cache(files_read(plan.workload.data, kind))
        cache_dir = scratch_cache_dir()
        try:
            records = _run_together(plan, _job(plan, kind, jobs, str(cache_dir)), jobs, timeout)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        yield ConcurrentRun(kind, tuple(job_run(i, r) for i, r in enumerate(records, 1)))
        if on_step is not None:
            on_step(f"{kind}: {jobs} jobs done")


def _job(plan: RunPlan, kind: str, jobs: int, cache_dir: str) -> WorkloadJob:
    w = plan.workload
    ours: dict[str, Any] = {}
    if KINDS[kind].cached:  # loader.DataLoader: its cache, and a group of its own
        ours = dict(cache_bytes=w.cache_bytes, cache_dir=cache_dir, coordinate=group_name(), group_size=jobs)
    return plan.job(kind, w.data, **ours)


def _run_together(plan: RunPlan, job: WorkloadJob, jobs: int, timeout: float) -> list[list[LoaderEpoch]]:
    """Start ``jobs`` copies of ``job``, wait for all of them, and return each one's training epochs."""
    spec = JobSpec(out_dir="", epochs=job.epochs, data=(job.data,))
    with contextlib.ExitStack() as stack:
        quiet = stack.enter_context(open(os.devnull, "w"))
        started = [
            stack.enter_context(StartedCommand(plan.argv(), spec, log=quiet, job=job)) for _ in range(jobs)
        ]
        _wait_all(started, job.loader, timeout)
        return [train_epochs(s.wait().records)[0] for s in started]


def _wait_all(started: Sequence[StartedCommand], loader: str, timeout: float) -> None:
    """Until every job has exited; the first to fail raises at once (CommandFailed), as does the timeout."""
    deadline = time.monotonic() + timeout
    while any(s.poll() is None for s in started):
        failed = next((s for s in started if s.poll() not in (None, 0)), None)
        if failed is not None:
            failed.wait()
        if time.monotonic() > deadline:
            raise JobFailed(f"{len(started)} {loader} jobs still running after {timeout:.0f} s")
        time.sleep(_POLL)
