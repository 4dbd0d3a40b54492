"""From a job's three runs (``LoaderEpoch`` lines of each) to its ``LoaderReport``, one way for every ``Job``.

Per rank, the training loader is the one with the most batches (ties: the first iterated); its epochs make
the runs, and the differential breakdown is taken per rank. The report's figures are the slowest rank's
(the one a synchronous job waits for), and the rank whose data the others wait for at the collectives is
named (``collectives``); other loaders (evaluation) are kept apart, as phases. A generated job is a command
of one rank; what the job itself says is only what was run (``Job.workload_of``) and which loader made the
batches (``Job.made_by``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from stallbench.analysis import work
from stallbench.analysis.breakdown import breakdown
from stallbench.analysis.collectives import RankWaits, rank_waits
from stallbench.analysis.loader_report import Measurement, loader_report
from stallbench.analysis.results import LoaderReport, RankBreakdown, steady
from stallbench.analysis.runs import Bandwidths, Job, Variant, cold_condition
from stallbench.analysis.training import NoTrainingLoader, other_loaders, rank_runs, train_epochs
from stallbench.jobs.command import CommandRun
from stallbench.jobs.kinds import KINDS, STREAMING
from stallbench.jobs.spec import AS_IS
from stallbench.jobs.streaming_import import STAND_IN_NOTE, needs_stand_in

__all__ = ["NoTrainingLoader", "job_report"]  # the first from .training


def job_report(
    job: Job, variant: Variant, runs: Mapping[str, CommandRun], bandwidths: Bandwidths
) -> LoaderReport:
    """The report of ``variant``'s three runs (``ingestion``, ``prep``, ``cold``), the machine's
    ``bandwidths`` beside them: its column is named by the kind asked (as the job wrote it: by the class
    that made the batches); where the batches came from another class, the advice says so first."""
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
    workload, share = job.workload_of(cold_rows)
    made_by = job.made_by(variant.kind, cold_rows)
    loader = made_by if variant.kind == AS_IS else variant.kind
    cut = f"epochs cut to {job.steps} steps read {share:.0%} of the data: run without --steps for what-if"
    cold_steady = steady(list(phases["cold"].epochs))
    target = next(iter(runs["cold"].targets), None)
    extra = {
        "ranks": ranks,
        "slowest_rank": slowest.rank,
        "holding_rank": _holding(ranks),
        "other_loaders": other_loaders(runs["cold"].records, slowest.rank),
        "useful": work.useful_work(cold_steady, variant.packing, variant.max_len, target=target),
    }
    measurement = Measurement(
        loader,
        made_by,
        workload,
        phases,
        *bandwidths,
        breakdown=slowest.breakdown,
        what_if=share >= 0.99,
        said=cut,
        note=" ".join(_notes(loader, made_by, cold_rows[-1].loader_class)),
        extra=extra,
    )
    return loader_report(measurement)


def _holding(ranks: Sequence[RankBreakdown]) -> int | None:
    """The rank whose data the others waited for most at the collectives; None where none was waited for."""
    most = max(ranks, key=lambda r: r.holds_others_seconds)
    return most.rank if most.holds_others_seconds > 0 else None


def _notes(loader: str, made_by: str, made: str) -> list[str]:
    """What the column's reader must know: the class that made the batches where it is not the one asked
    for, and a peer run with a stand-in for an import it cannot have."""
    notes = []
    if made_by != loader:
        notes.append(
            f"the batches came from {made}, not {KINDS[loader].label}: this column measures that class."
        )
    if loader == STREAMING and needs_stand_in():
        notes.append(STAND_IN_NOTE)
    return notes
