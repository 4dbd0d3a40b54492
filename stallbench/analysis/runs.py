"""The three differential runs, one method for every job: a generated workload (``phases``) and the user's
own command (``user_analysis``) are two ``Job``s of it, which ``analyze.analyze`` runs and reports one way.

- prep: every file of the data in the page cache, our loader's cache (if any) sized to hold every record:
  T3, the pipeline with nothing to fetch;
- ingestion: batches already made, handed to the step again and again: T1, the step alone (told the prep
  run, so that it can hand out as many batches an epoch as the pipeline did);
- cold: the data evicted from the page cache, the asked storage condition (kernel read throttle, memory
  limit) on the whole process tree, our cache (if any) at the asked size and empty: T2.

prep stall = T3 - T1 and fetch stall = T2 - T3 (``breakdown``). Each run is yielded as soon as it is done,
so an interrupted analysis keeps the finished ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import Limits
from stallbench.conditions.storage import evict_page_cache, warm_page_cache

if TYPE_CHECKING:
    from stallbench.analysis.results import Workload
    from stallbench.jobs.command import CommandRun
    from stallbench.jobs.spec import LoaderEpoch

__all__ = [
    "PHASES",
    "Bandwidths",
    "Job",
    "Phase",
    "PhasedRun",
    "Variant",
    "cold_condition",
    "collected",
    "full_cache_bytes",
    "three_runs",
]

Phase = Literal["prep", "ingestion", "cold"]
PHASES: tuple[Phase, ...] = ("ingestion", "prep", "cold")  # as reports list them: T1, T3, T2
_FULL_MARGIN = 64 << 20


def full_cache_bytes(dataset_bytes: int) -> int:
    """The prep run's cache: every record (device bytes are more than records), its index, a margin."""
    return int(dataset_bytes * 1.01) + _FULL_MARGIN


def cold_condition(limits: Limits) -> str:
    """The cold run's condition in words: the page cache evicted, then each limit asked for."""
    return ", ".join(["page cache evicted", *limits.said(unset=False)])


Bandwidths = tuple[float, float]  # the machine's (storage, memory) bytes per second


@dataclass(frozen=True)
class Variant:
    """One column of an analysis: loader ``kind``, its token batches packed with ``packing`` into ``max_len``
    tokens (None: as the job makes them)."""

    kind: str
    packing: str | None = None
    max_len: int | None = None

    @property
    def label(self) -> str:
        return f"{self.kind}+{self.packing}" if self.packing else self.kind


class Job(Protocol):
    """What ``analyze`` analyses: a generated workload (``phases.RunPlan``) or the user's command
    (``user_analysis.UserJob``). Everything else, the runs' order, the machine's measuring, the split and
    the report, is the one method's."""

    limits: Limits  # the cold run's, as the options asked them
    dataset_bytes: int
    cache_bytes: int | None  # our loader's cache in the cold run
    steps: int | None  # batches an epoch is cut to; None: whole epochs

    def variants(self, kinds: Sequence[str]) -> list[Variant]:
        """The columns of loaders ``kinds``, in order."""
        ...

    def three_runs(self, variant: Variant, log: IO[str] | None) -> Iterator[tuple[Phase, CommandRun]]:
        """``three_runs`` of ``variant``; the job's own output to ``log`` (None: through)."""
        ...

    def opened(self) -> AbstractContextManager[tuple[Job, Callable[[int], Bandwidths]]]:
        """For the runs: the job to run, and how to measure the machine's bandwidths with as many readers
        as the job has workers."""
        ...

    def workload_of(self, cold_rows: Sequence[LoaderEpoch]) -> tuple[Workload, float]:
        """What was run, as the cold run's training loader's epochs (``cold_rows``) describe it, and the
        share of the data an epoch read."""
        ...

    def made_by(self, kind: str, cold_rows: Sequence[LoaderEpoch]) -> str:
        """The kind of loader whose batches the column of ``kind`` measured."""
        ...

    def read_by(self, kind: str) -> Sequence[str | Path]:
        """The local files the job reads with loader ``kind``."""
        ...

    def memory_probe(
        self, kind: str, cache_dir: Path, limits: StorageLimits, log: IO[str] | None
    ) -> list[int]:
        """The job with loader ``kind`` cut to its first ``memory.probe_batches`` inside ``limits`` (our
        cache in ``cache_dir``, holding no record); the workers of the loaders it ran."""
        ...

    def sized(self, memory_limit: int) -> Job:
        """The job with ``--memory-limit auto`` sized to ``memory_limit`` bytes."""
        ...


class PhasedRun(Protocol):
    """What the runs are made of: a job that runs once per phase (a target, ``stallbench.cli.targets``, has
    one per loader it runs)."""

    def data(self) -> Sequence[str | Path]:
        """The files the job reads: warmed before the prep run, evicted before the cold run."""
        ...

    def run(
        self, phase: Phase, *, cache_bytes: int | None, limits: StorageLimits | None, prep: Any = None
    ) -> Any:
        """One run of ``phase``: ``cache_bytes`` for our loader's cache, ``limits`` around the whole process
        tree; the ingestion run is told the prep run's result (``prep``)."""
        ...


def three_runs(
    job: PhasedRun, dataset_bytes: int, cache_bytes: int | None, limits: StorageLimits | None
) -> Iterator[tuple[Phase, Any]]:
    """The runs of ``job`` in order, prep first: (phase, what its ``run`` returned). ``cache_bytes`` and
    ``limits`` are the cold run's: the configuration as asked."""
    warm_page_cache(job.data())
    prep = job.run("prep", cache_bytes=full_cache_bytes(dataset_bytes), limits=None)
    yield "prep", prep
    yield "ingestion", job.run("ingestion", cache_bytes=None, limits=None, prep=prep)
    evict_page_cache(job.data())
    yield "cold", job.run("cold", cache_bytes=cache_bytes, limits=limits)


def collected(runs: Iterable[tuple[Phase, Any]], step: Callable[[str], None], label: str) -> dict[Phase, Any]:
    """Every run of ``runs`` (``three_runs``'s pairs), ``step("<label>: <phase> done")`` told as each ends;
    in ``PHASES`` order, as reports list them."""
    got = {}
    for phase, run in runs:
        got[phase] = run
        step(f"{label}: {phase} done")
    return {phase: got[phase] for phase in PHASES}
