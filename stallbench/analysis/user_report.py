"""From what the user's command measured (``LoaderEpoch`` lines of each run) to a ``LoaderReport``.

Per rank, the training loader is the one with the most batches (ties: the first iterated); its epochs make
the runs, and the differential breakdown is taken per rank. The report's figures are the slowest rank's
(the one a synchronous job waits for), and the rank whose data the others wait for at the collectives is
named (``collectives``); other loaders (evaluation) are kept apart, as phases.

When ``--steps`` cuts an epoch short, the epoch reads only a share of the data: the roofline weighs that
share of the dataset's bytes, and what-if predictions, which speak of whole datasets and caches, are left
out (run without ``--steps`` to get them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import TYPE_CHECKING

from stallbench.analysis import work
from stallbench.analysis.breakdown import breakdown
from stallbench.analysis.collectives import RankWaits, rank_waits
from stallbench.analysis.loader_report import Measurement, loader_report
from stallbench.analysis.results import (
    LoaderReport,
    RankBreakdown,
    Workload,
    steady,
)
from stallbench.analysis.runs import cold_condition
from stallbench.analysis.training import NoTrainingLoader, other_loaders, rank_runs, train_epochs
from stallbench.jobs.kinds import KINDS, kind_of_class
from stallbench.jobs.spec import AS_IS, LoaderEpoch

if TYPE_CHECKING:
    from stallbench.analysis.user_analysis import UserJob
    from stallbench.jobs.command import CommandRun

__all__ = ["NoTrainingLoader", "train_epochs", "user_report"]  # the first two from ._training


def user_report(
    job: UserJob,
    runs: Mapping[str, CommandRun],
    *,
    storage_bytes_per_s: float,
    memory_bytes_per_s: float,
    kind: str = AS_IS,
) -> LoaderReport:
    """The report of the three runs (``ingestion``, ``prep``, ``cold``) of loader ``kind``: its column is
    named so; where the batches came from another class, the advice says so first."""
    per_rank = rank_runs(runs, cold_condition(job.limits))
    waits = rank_waits({rank: p["cold"].timeline for rank, p in per_rank.items()})
    none = RankWaits(0.0, 0.0)  # one process: no collective
    ranks = tuple(
        RankBreakdown(rank, breakdown(p, job.dataset_bytes), **dataclasses.asdict(waits.get(rank, none)))
        for rank, p in per_rank.items()
    )
    slowest = max(ranks, key=lambda r: r.breakdown.epoch_seconds)
    phases = per_rank[slowest.rank]
    cold_rows = train_epochs(runs["cold"].records)[slowest.rank]
    workload, share = _workload(job, cold_rows)
    made_by = kind_of_class(cold_rows[-1].loader_class)
    loader = made_by if kind == AS_IS else kind
    cut = f"epochs cut to {job.steps} steps read {share:.0%} of the data: run without --steps for what-if"
    made = cold_rows[-1].loader_class
    note = f"the batches came from {made}, not {KINDS[loader].label}: this column measures that class."
    extra = {
        "ranks": ranks,
        "slowest_rank": slowest.rank,
        "holding_rank": _holding(ranks),
        "other_loaders": other_loaders(runs["cold"].records, slowest.rank),
        "useful": work.useful_work(
            steady(list(phases["cold"].epochs)), target=next(iter(runs["cold"].targets), None)
        ),
    }
    measurement = Measurement(
        loader,
        made_by,
        workload,
        phases,
        storage_bytes_per_s,
        memory_bytes_per_s,
        breakdown=slowest.breakdown,
        what_if=share >= 0.99,
        said=cut,
        note=note if made_by != loader else "",
        extra=extra,
    )
    return loader_report(measurement)


def _holding(ranks: Sequence[RankBreakdown]) -> int | None:
    """The rank whose data the others waited for most at the collectives; None where none was waited for."""
    most = max(ranks, key=lambda r: r.holds_others_seconds)
    return most.rank if most.holds_others_seconds > 0 else None


def _workload(job: UserJob, cold_rows: Sequence[LoaderEpoch]) -> tuple[Workload, float]:
    """What was run, with the dataset's bytes scaled to the share of it an epoch read."""
    last = cold_rows[-1]
    samples = round(fmean(r.samples for r in steady(list(cold_rows))))
    share = min(1.0, samples / last.dataset_len) if last.dataset_len else 1.0
    scale = lambda n: max(1, round(n * share))  # noqa: E731
    workload = Workload(
        data=",".join(str(p) for p in job.data),
        dataset_bytes=scale(job.dataset_bytes),
        record_bytes=scale(job.record_bytes),
        samples=samples,
        batch_size=last.batch_size or 1,
        workers=last.workers,
        compute="the command's own step",
        epochs=len(cold_rows),
        cache_bytes=scale(job.cache_bytes) if job.cache_bytes is not None else None,
        **job.limits.known(),
        command=" ".join(job.argv),
        prefetch_factor=last.prefetch_factor if last.workers else None,
        opens_own_files=not last.source_backed,
    )
    return workload, share
