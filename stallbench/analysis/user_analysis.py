"""``stallbench analyze -- python train.py``: the three differential runs on the user's own command.

- prep: every file of ``--data`` in the page cache (our loader's cache sized to hold it all): T3;
- ingestion: each loader's first batches, made in the script's process, handed out again for every batch
  (no worker started), as many an epoch as the prep run handed out: the step alone, T1;
- cold: ``--data`` evicted from the page cache, the storage throttle and memory limit on the whole process
  tree, our cache (if any) at the asked size: T2.

The training loader is the one with the most batches in a process; any other (evaluation) is reported
apart. Every rank of a torchrun job gets its own breakdown; the report's figures are the slowest rank's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from stallbench.analysis.results import LoaderReport
from stallbench.analysis.user_report import user_report
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.storage import evict_page_cache, warm_page_cache
from stallbench.jobs.command import CommandRun, run_command
from stallbench.jobs.kinds import CACHED, KINDS
from stallbench.jobs.run import scratch_cache_dir
from stallbench.jobs.spec import JobSpec, LoaderEpoch

__all__ = [
    "Applied",
    "NotRunnable",
    "UserJob",
    "analyze_command",
    "apply_advice",
    "replay_lengths",
    "run_setting",
    "run_user_phases",
]

_FULL_MARGIN = 64 << 20  # the prep run's cache: every record, its index, a margin


@dataclass(frozen=True)
class UserJob:
    """The user's command and how to run it."""

    argv: tuple[str, ...]
    data: tuple[Path, ...]  # the files the job reads: warmed, evicted and throttled
    dataset_bytes: int  # device bytes of ``data``
    record_bytes: int
    cache_bytes: int | None  # our loader's cache in the cold run (compare, or a script that uses ours)
    storage_bandwidth: int | None = None
    memory_limit: int | None = None
    steps: int | None = None
    epochs: int = 3
    time_limit: float | None = None
    cache_dir: str = "/dev/shm"


def _spec(job: UserJob, kind: str, **options: object) -> JobSpec:
    data = tuple(str(p) for p in job.data)
    return JobSpec(out_dir="", steps=job.steps, epochs=job.epochs, loader=kind, data=data, **options)


def run_user_phases(job: UserJob, kind: str, log: IO[str] | None = None) -> Iterator[tuple[str, CommandRun]]:
    """The three runs of ``job`` with the loaders ``kind`` ("as-is", "torch" or "cached"): prep first, so
    that ingestion hands out as many batches an epoch as the pipeline did."""
    warm_page_cache(job.data)
    full = int(job.dataset_bytes * 1.01) + _FULL_MARGIN
    prep = _with_cache(job, kind, full, None, log)
    yield "prep", prep
    ingestion = _spec(job, kind, mode="ingestion", replay_lengths=replay_lengths(prep.records))
    yield "ingestion", run_command(job.argv, ingestion, time_limit=job.time_limit, log=log)
    evict_page_cache(job.data)
    limits = _limits(job)
    yield "cold", _with_cache(job, kind, job.cache_bytes, limits, log)


def replay_lengths(records: Sequence[LoaderEpoch]) -> dict[str, tuple[int, ...]]:
    """Per loader id, the batches of each complete epoch of a run, as rank 0's main process handed them out
    (its process with the most batches)."""
    batches: dict[int, int] = {}
    for r in records:
        if r.rank == 0:
            batches[r.pid] = batches.get(r.pid, 0) + r.batches
    if not batches:
        return {}
    main = max(batches, key=batches.__getitem__)
    lengths: dict[str, list[int]] = {}
    for r in sorted(records, key=lambda r: r.epoch):
        if r.pid == main and r.complete:
            lengths.setdefault(r.loader, []).append(r.batches)
    return {loader: tuple(counts) for loader, counts in lengths.items()}


def _with_cache(
    job: UserJob,
    kind: str,
    cache_bytes: int | None,
    limits: StorageLimits | None,
    log: IO[str] | None,
) -> CommandRun:
    """One pipeline run with a fresh, private cache folder (removed after) for our loader's store."""
    cache_dir = scratch_cache_dir(job.cache_dir)
    try:
        spec = _spec(job, kind, cache_bytes=cache_bytes, cache_dir=str(cache_dir))
        return run_command(job.argv, spec, limits=limits, time_limit=job.time_limit, log=log)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def _limits(job: UserJob) -> StorageLimits | None:
    return StorageLimits.asked(job.storage_bandwidth, job.memory_limit, job.data[0])


def analyze_command(
    job: UserJob,
    kinds: Sequence[str],
    on_step: Callable[[str], None] | None = None,
    log: IO[str] | None = None,
) -> Iterator[LoaderReport]:
    """One report per loader kind, yielded as each is done. The machine is measured after the first kind's
    runs, when the job's workers are known: storage is read by as many readers as they are."""
    step = on_step or (lambda label: None)
    machine: tuple[float, float] | None = None
    for kind in kinds:
        done = {}
        for phase, run in run_user_phases(job, kind, log):
            done[phase] = run
            step(f"{kind}: {phase} done")
        runs = {phase: done[phase] for phase in ("ingestion", "prep", "cold")}
        if machine is None:
            machine = _measure_machine(job, runs["cold"])
            step("machine measured")
        yield user_report(job, runs, storage_bytes_per_s=machine[0], memory_bytes_per_s=machine[1], kind=kind)


def _measure_machine(job: UserJob, cold: CommandRun) -> tuple[float, float]:
    """Storage (inside the cold run's limits, as many readers as the training loader has workers) and
    memory bandwidth."""
    from stallbench.analysis.measure import measure_bandwidths

    workers = max((r.workers for r in cold.records), default=1)
    return measure_bandwidths(list(job.data), limits=_limits(job), readers=max(1, workers))


def run_setting(
    job: UserJob,
    kind: str,
    *,
    workers: int | None = None,
    cache_bytes: int | None = None,
    prefetch_factor: int | None = None,
    log: IO[str] | None = None,
) -> float:
    """The steady epoch of the training loader in one cold run of ``job`` with loaders ``kind`` ("as-is",
    "torch" or "cached"), every DataLoader built with ``workers`` and ``prefetch_factor`` (None: as the
    script wrote them) and our cache at ``cache_bytes``: how a what-if or an advice is checked."""
    from stallbench.analysis.results import steady
    from stallbench.analysis.training import train_epochs

    cache_dir = scratch_cache_dir(job.cache_dir)
    try:
        spec = _spec(
            job, kind, cache_bytes=cache_bytes, cache_dir=str(cache_dir), workers=workers,
            prefetch_factor=prefetch_factor,
        )  # fmt: skip
        evict_page_cache(job.data)
        run = run_command(job.argv, spec, limits=_limits(job), time_limit=job.time_limit, log=log)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    epochs = max(train_epochs(run.records, "the run").values(), key=lambda rows: rows[-1].seconds)
    return sum(r.seconds for r in steady(epochs)) / len(steady(epochs))


@dataclass(frozen=True)
class Applied:
    """``--apply``: the advised setting run cold, against what was predicted for it."""

    setting: str
    predicted_seconds: float
    measured_seconds: float

    @property
    def error(self) -> float:
        return self.measured_seconds / self.predicted_seconds - 1.0


class NotRunnable(ValueError):
    """The advice names a setting no run can make as it stands (a page cache of a given size)."""


def apply_advice(job: UserJob, report: LoaderReport, kind: str, log: IO[str] | None = None) -> Applied | None:
    """Rerun the cold run of loaders ``kind`` (as analyzed) with the setting the report's advice names, and
    only that setting changed; None where it names none."""
    from stallbench.analysis import advice, whatif
    from stallbench.conditions.sizes import format_bytes

    m = whatif.Measured(
        report.workload, report.breakdown, report.machine, report.loader, report.storage_bytes
    )
    chosen = advice.advised(m, report.predictions)
    if chosen is None:
        return None
    prediction, loader = chosen
    cached = KINDS[loader].cached
    if not cached and prediction.workers == report.workload.workers:  # torch's advice: a cache, not workers
        raise NotRunnable(
            f"the advice is a page cache of {format_bytes(prediction.cache_bytes)}, which a run cannot set"
        )
    cache = prediction.cache_bytes if cached else job.cache_bytes
    kind = CACHED if cached else kind  # our loader, with the advised cache, whatever the script builds
    measured = run_setting(job, kind, workers=prediction.workers, cache_bytes=cache, log=log)
    where = f"{prediction.workers} workers" + (
        f", {KINDS[CACHED].label} with cache_bytes={cache:_}" if cached else ""
    )
    return Applied(where, prediction.epoch_seconds, measured)
