"""``stallbench analyze -- python train.py``: the user's own command as a target of the three differential
runs (``runs.three_runs``). Its ingestion run keeps each loader's first batches, made in the script's
process, and hands them out again for every batch (no worker started), as many an epoch as the prep run
handed out: the step alone, T1.

The training loader is the one with the most batches in a process; any other (evaluation) is reported
apart. Every rank of a torchrun job gets its own breakdown; the report's figures are the slowest rank's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from stallbench.analysis.memory import measure_overhead, memory_limit, probe_batches, probe_cache_bytes
from stallbench.analysis.results import LoaderReport
from stallbench.analysis.runs import Phase, collected, three_runs
from stallbench.analysis.training import replay_lengths
from stallbench.analysis.user_report import user_report
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import NONE, Limits
from stallbench.conditions.storage import files_in
from stallbench.jobs.command import CommandRun, run_command
from stallbench.jobs.run import scratch_cache_dir
from stallbench.jobs.spec import JobSpec

__all__ = [
    "CommandRuns",
    "UserJob",
    "analyze_command",
    "run_once",
    "run_user_phases",
    "sized_memory",
]


@dataclass(frozen=True)
class UserJob:
    """The user's command and how to run it."""

    argv: tuple[str, ...]
    data: tuple[Path, ...]  # the files the job reads: warmed, evicted and throttled
    dataset_bytes: int  # device bytes of ``data``
    record_bytes: int
    cache_bytes: int | None  # our loader's cache in the cold run (compare, or a script that uses ours)
    limits: Limits = NONE  # the cold run's, as the options asked them
    steps: int | None = None
    epochs: int = 3
    time_limit: float | None = None
    cache_dir: str | None = None  # None: the loader's default (``loader.system.home``)

    def spec(self, kind: str, **options: object) -> JobSpec:
        """A run of the command with loaders ``kind``; ``options``: the rest of the :class:`JobSpec`."""
        data = tuple(str(p) for p in self.data)
        return JobSpec(out_dir="", steps=self.steps, epochs=self.epochs, loader=kind, data=data, **options)

    def cgroup(self) -> StorageLimits | None:
        """The cgroup of the cold run's limits, on reads from the disk of the data."""
        return self.limits.cgroup(self.data[0])


def run_user_phases(job: UserJob, kind: str, log: IO[str] | None = None) -> Iterator[tuple[str, CommandRun]]:
    """The three runs of ``job`` with the loaders ``kind`` ("as-is", "torch" or "cached")."""
    return three_runs(CommandRuns(job, kind, log), job.dataset_bytes, job.cache_bytes, job.cgroup())


@dataclass(frozen=True)
class CommandRuns:
    """The user's command with the loaders ``kind``, run once per phase."""

    job: UserJob
    kind: str
    log: IO[str] | None = None

    def data(self) -> tuple[Path, ...]:
        return self.job.data

    def run(
        self, phase: Phase, *, cache_bytes: int | None, limits: StorageLimits | None, prep: Any = None
    ) -> CommandRun:
        """Ingestion hands out as many batches an epoch as the prep run did (``replay_lengths``)."""
        if phase != "ingestion":
            return run_once(self.job, self.kind, cache_bytes, limits, self.log)
        lengths = replay_lengths(prep.records)
        return run_once(self.job, self.kind, None, None, self.log, mode="ingestion", replay_lengths=lengths)


def run_once(
    job: UserJob,
    kind: str,
    cache_bytes: int | None,
    limits: StorageLimits | None,
    log: IO[str] | None,
    **options: object,
) -> CommandRun:
    """One run with a fresh, private cache folder (removed after) for our loader's store, whatever folder
    the script names; ``options``: the rest of the :class:`JobSpec` (``mode``, ``workers``,
    ``prefetch_factor``, ``cache_form``)."""
    cache_dir = scratch_cache_dir(job.cache_dir)
    try:
        spec = job.spec(kind, cache_bytes=cache_bytes, cache_dir=str(cache_dir), **options)
        return run_command(job.argv, spec, limits=limits, time_limit=job.time_limit, log=log)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def sized_memory(job: UserJob, kinds: Sequence[str], log: IO[str] | None = None) -> UserJob:
    """``--memory-limit auto`` sized as for a generated job: the cache budget plus the most memory the
    command needs with any of the loaders ``kinds``, measured over its first ``probe_batches`` (our
    loader's cache held at its index), and the margins of ``memory.memory_limit``."""
    workers: list[int] = []
    probe_job = replace(job, steps=probe_batches(None), epochs=1)  # its workers are known only once it runs
    records = sum(1 for _ in files_in(job.data))

    def probe(kind: str, cache_dir: Path, limits: StorageLimits) -> None:
        spec = probe_job.spec(kind, cache_bytes=probe_cache_bytes(records), cache_dir=str(cache_dir))
        run = run_command(job.argv, spec, limits=limits, time_limit=job.time_limit, log=log)
        workers.extend(r.workers for r in run.records)

    overheads = measure_overhead(probe, kinds, job.data)
    limit = memory_limit(job.cache_bytes or 0, overheads, max(workers, default=0))
    return replace(job, limits=job.limits.sized(limit))


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
        runs = collected(run_user_phases(job, kind, log), step, kind)
        if machine is None:
            machine = _measure_machine(job, runs["cold"])
            step("machine measured")
        yield user_report(job, runs, storage_bytes_per_s=machine[0], memory_bytes_per_s=machine[1], kind=kind)


def _measure_machine(job: UserJob, cold: CommandRun) -> tuple[float, float]:
    """Storage (inside the cold run's limits, as many readers as the training loader has workers) and
    memory bandwidth."""
    from stallbench.analysis.measure import measure_bandwidths

    workers = max((r.workers for r in cold.records), default=1)
    return measure_bandwidths(list(job.data), limits=job.cgroup(), readers=max(1, workers))
