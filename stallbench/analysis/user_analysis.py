"""``stallbench analyze -- python train.py``: the user's own command as a ``runs.Job`` of the one method
(``analyze.analyze``). Its ingestion run keeps each loader's first batches, made in the script's process,
and hands them out again for every batch (no worker started), as many an epoch as the prep run handed out:
the step alone, T1.

What was run is what the records say: the training loader's batch size, workers and prefetch, and, where
``--steps`` cuts an epoch short, the share of the data it read: the roofline weighs that share of the
dataset's bytes, and what-if predictions, which speak of whole datasets and caches, are left out.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import fmean
from typing import IO, Any

from stallbench.analysis.measure import measure_bandwidths
from stallbench.analysis.memory import probe_batches, probe_cache_bytes
from stallbench.analysis.results import Workload, steady
from stallbench.analysis.runs import Bandwidths, Phase, Variant, three_runs
from stallbench.analysis.training import replay_lengths
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import NONE, Limits
from stallbench.conditions.storage import files_in
from stallbench.jobs.command import CommandRun, run_command
from stallbench.jobs.kinds import kind_of_class
from stallbench.jobs.run import scratch_cache_dir
from stallbench.jobs.spec import JobSpec, LoaderEpoch

__all__ = ["CommandRuns", "UserJob", "run_once", "run_user_phases"]


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

    @functools.cached_property
    def records(self) -> int:
        """The files of ``data``, counted once (a folder of a million files is walked once)."""
        return sum(1 for _ in files_in(self.data))

    def cgroup(self) -> StorageLimits | None:
        """The cgroup of the cold run's limits, on reads from the disk of the data."""
        return self.limits.cgroup(self.data[0])

    def variants(self, kinds: Sequence[str]) -> list[Variant]:
        return [Variant(kind) for kind in kinds]

    def three_runs(self, variant: Variant, log: IO[str] | None = None) -> Iterator[tuple[Phase, CommandRun]]:
        return run_user_phases(self, variant.kind, log)

    @contextlib.contextmanager
    def opened(self) -> Iterator[tuple[UserJob, Callable[[int], Bandwidths]]]:
        """The job as it is, and the bandwidths of its data's disk inside the cold run's limits."""
        yield self, lambda readers: measure_bandwidths(list(self.data), limits=self.cgroup(), readers=readers)

    def workload_of(self, cold_rows: Sequence[LoaderEpoch]) -> tuple[Workload, float]:
        """What was run, with the dataset's bytes scaled to the share of it an epoch read."""
        last = cold_rows[-1]
        samples = round(fmean(r.samples for r in steady(list(cold_rows))))
        share = min(1.0, samples / last.dataset_len) if last.dataset_len else 1.0
        scale = lambda n: max(1, round(n * share))  # noqa: E731
        workload = Workload(
            data=",".join(str(p) for p in self.data),
            dataset_bytes=scale(self.dataset_bytes),
            record_bytes=scale(self.record_bytes),
            samples=samples,
            batch_size=last.batch_size or 1,
            workers=last.workers,
            compute="the command's own step",
            epochs=len(cold_rows),
            cache_bytes=scale(self.cache_bytes) if self.cache_bytes is not None else None,
            **self.limits.known(),
            command=" ".join(self.argv),
            prefetch_factor=last.prefetch_factor if last.workers else None,
            opens_own_files=not last.source_backed,
        )
        return workload, share

    def made_by(self, kind: str, cold_rows: Sequence[LoaderEpoch]) -> str:
        """The kind of the class that made the cold run's batches: a script may keep its own loader."""
        return kind_of_class(cold_rows[-1].loader_class)

    def read_by(self, kind: str) -> tuple[Path, ...]:
        return self.data

    def memory_probe(
        self, kind: str, cache_dir: Path, limits: StorageLimits, log: IO[str] | None = None
    ) -> list[int]:
        """Its workers are known only once it runs: cut to the fewest batches of ``probe_batches``."""
        probe = replace(self, steps=probe_batches(None), epochs=1)
        spec = probe.spec(kind, cache_bytes=probe_cache_bytes(self.records), cache_dir=str(cache_dir))
        run = run_command(self.argv, spec, limits=limits, time_limit=self.time_limit, log=log)
        return [r.workers for r in run.records]

    def sized(self, memory_limit: int) -> UserJob:
        return replace(self, limits=self.limits.sized(memory_limit))


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
