"""Which of a run's records are the training loader's: per rank, the process with the most batches; in it, the
loader with the most batches (ties: the one iterated first). Every other loader (evaluation) is kept apart.
Its epochs make the run's record (``run_record``), one way for a generated job and the user's command.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from statistics import fmean

from stallbench.analysis.results import EpochRecord, OtherLoader, RunRecord, SlowSample, steady
from stallbench.jobs.command import CommandRun
from stallbench.jobs.spec import SETTING_FIELDS, LoaderEpoch

__all__ = [
    "NoTrainingLoader",
    "by_rank",
    "other_loaders",
    "rank_runs",
    "replay_lengths",
    "run_record",
    "train_epochs",
    "train_id",
]

_STAGES = ("fetch_seconds", "decode_seconds", "collate_seconds")  # the loader's stats() that time its stages
_EPOCH_FIELDS = tuple(EpochRecord.__dataclass_fields__)  # each one a LoaderEpoch field of the same name
_CONDITIONS = {
    "ingestion": "the first batches replayed, no worker started: only the step",
    "prep": "every file of the data in memory (warm)",
}


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


def run_record(
    phase: str, condition: str, epochs: Sequence[LoaderEpoch], other_load_cores: float = 0.0
) -> RunRecord:
    """One run of the training loader from its complete ``epochs`` (in order): each epoch's figures, the
    stage times of the steady epochs where the loader times them, the last epoch's timeline and the form of
    record our cache held and whether batches were made of the samples ready first."""
    records = tuple(EpochRecord(**{k: getattr(r, k) for k in _EPOCH_FIELDS}) for r in epochs)
    last = epochs[-1].stats
    stages = {
        k.removesuffix("_seconds"): sum(r.stats.get(k, 0.0) for r in steady(list(epochs)))
        for k in _STAGES
        if k in last
    }
    timeline = tuple((float(w), float(s)) for w, s in epochs[-1].timeline)
    settings = {k: last[k] for k in SETTING_FIELDS if k in last}
    settings["slow_again"] = slow_again(epochs)
    settings["slow_sample_count"] = epochs[-1].slow_sample_count
    settings["slow_samples"] = tuple(
        SlowSample(i, s, p) for i, s, p in epochs[-1].slow_samples if type(i) is int
    )
    return RunRecord(phase, records, condition, stages, timeline, other_load_cores, **settings)


def rank_runs(runs: Mapping[str, CommandRun], cold: str) -> dict[int, dict[str, RunRecord]]:
    """Per rank, its runs of the training loader (``runs``: each phase's run of the command, a generated job's
    too); ``cold``: the cold run's condition in words."""
    per_phase = {phase: train_epochs(run.records, phase) for phase, run in runs.items()}
    ranks = sorted(set.intersection(*(set(p) for p in per_phase.values())))
    out: dict[int, dict[str, RunRecord]] = {}
    for rank in ranks:
        out[rank] = {}
        for phase, epochs in per_phase.items():
            if not epochs[rank]:
                raise NoTrainingLoader(
                    f"the {phase} run of rank {rank} finished no epoch of its training loader"
                )
            condition = _CONDITIONS.get(phase, cold)
            out[rank][phase] = run_record(phase, condition, epochs[rank], runs[phase].other_load_cores)
    return out


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


def slow_again(epochs: Sequence[LoaderEpoch]) -> float:
    """The share of the last epoch's slow samples' time taken by samples slow in the epoch before too: near
    1, the same samples are slow every epoch (a huge image, a slow file); near 0, chance (a worker
    preempted). Weighed by time, not counted: on a busy machine dozens of preempted samples each a few ms
    over the mark join the 16 that take 25 ms every epoch (counted, 23% again; by time, most of the toll)."""
    if len(epochs) < 2 or not epochs[-1].slow_times:
        return 0.0
    before = {int(index) for index, _ in epochs[-2].slow_times}
    total = sum(seconds for _, seconds in epochs[-1].slow_times)
    again = sum(seconds for index, seconds in epochs[-1].slow_times if int(index) in before)
    return again / total if total > 0 else 0.0
