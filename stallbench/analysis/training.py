"""Which of a run's records are the training loader's: per rank, the process with the most batches; in it, the
loader with the most batches (ties: the one iterated first). Every other loader (evaluation) is kept apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from statistics import fmean

from stallbench.analysis.results import OtherLoader
from stallbench.jobs.spec import LoaderEpoch

__all__ = ["NoTrainingLoader", "by_rank", "other_loaders", "train_epochs", "train_id"]


class NoTrainingLoader(RuntimeError):
    """A run of the command iterated no DataLoader the bootstrap could see."""


def by_rank(records: Sequence[LoaderEpoch]) -> dict[int, list[LoaderEpoch]]:
    """Each rank's records, from its process with the most batches (a rank's helper processes left out)."""
    by_process: dict[tuple[int, int], list[LoaderEpoch]] = defaultdict(list)
    for r in records:
        by_process[r.rank, r.pid].append(r)
    ranks: dict[int, list[LoaderEpoch]] = {}
    for (rank, _), rows in sorted(by_process.items(), key=lambda kv: -sum(r.batches for r in kv[1])):
        ranks.setdefault(rank, rows)
    return ranks


def train_id(rows: Sequence[LoaderEpoch]) -> str:
    totals: dict[str, int] = {}
    for r in rows:
        totals[r.loader] = totals.get(r.loader, 0) + r.batches
    order = {loader: int(loader.split(":", 1)[0]) for loader in totals}
    return min(totals, key=lambda loader: (-totals[loader], order[loader]))


def train_epochs(records: Sequence[LoaderEpoch], phase: str = "") -> dict[int, list[LoaderEpoch]]:
    """Per rank, the training loader's complete epochs in order."""
    ranks = by_rank(records)
    if not ranks:
        raise NoTrainingLoader(
            f"the {phase or 'command'} run iterated no DataLoader: does the command run Python with "
            "torch's DataLoader (or loader.DataLoader) in this environment?"
        )
    out = {}
    for rank, rows in ranks.items():
        train = train_id(rows)
        out[rank] = sorted((r for r in rows if r.loader == train and r.complete), key=lambda r: r.epoch)
    return out


def other_loaders(records: Sequence[LoaderEpoch], rank: int) -> tuple[OtherLoader, ...]:
    rows = by_rank(records).get(rank, [])
    if not rows:
        return ()
    train = train_id(rows)
    grouped: dict[str, list[LoaderEpoch]] = defaultdict(list)
    for r in rows:
        if r.loader != train:
            grouped[r.loader].append(r)
    return tuple(
        OtherLoader(name, len(es), fmean(e.seconds for e in es), fmean(e.batches for e in es))
        for name, es in sorted(grouped.items())
    )
