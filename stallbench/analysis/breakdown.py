"""A steady cold epoch split into parts that add up to it, for generated jobs and the user's command alike.

The real (cold) run measures its own epoch directly: the time the loop waited inside the loader's
``__next__`` and the rest, the loop's own time. So the split starts from what that run measured, not from
differences of separate runs:

* transitions = what the job did inside the epoch that is neither a step nor a wait: evaluations
  (another loader's epochs), checkpoint writes and ``torch.compile``'s compilations, each timed where the
  job made it (``stallbench.jobs._transitions``); those made between epochs are kept apart, as the warm-up
  is, and so are the first epoch's beyond a steady one's (its first compilations: of the warm-up);
* compute = the cold epoch less its wait and transitions: the steps as they ran beside the loader. Where
  they ran slower than alone (the ingestion run's steps, ``T1``), the excess is contention: workers sharing
  the step's cores. It is shown, inside compute: a slower step is not a stall.
* the wait is split in two by the warm (prep) run, which waited with every record in memory: what the cold
  epoch waited beyond it is the fetch stall (storage), the rest the prep stall. A cold epoch that read
  (next to) nothing from storage has no fetch stall: its extra wait cannot be storage's.

So compute + prep stall + fetch stall + transitions = the epoch, by construction. Each part carries its
spread: half the range of its per-epoch values over the steady cold epochs (the split also counts the warm
run's spread); NaN, unknown, with a single steady epoch. A difference smaller than the spreads is noise
(:func:`within_noise`).

Beside the parts, how the wait spreads over the batches (p50, p90, p99, max of the cold run's last epoch):
a wait that is all in a few batches is a few slow samples, not a slow pipeline; the slow batches (4x the
median or more) are counted, with what they waited beyond the median and its share of the epoch's wait.

``T1`` and the warm epoch ``T3`` (with its wait for the first batch) are kept beside the parts, and so are
the CPU the step took alone (the ingestion run's) and the CPU prep took (the warm run's beyond it), each per
batch times the cold epoch's batches: the what-if model is built on them. CPU seconds, unlike wall seconds,
do not grow when other work shares the cores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import fmean

import numpy as np

from stallbench.analysis.results import Breakdown, EpochRecord, RunRecord, steady
from stallbench.analysis.slow_samples import slow_batches

__all__ = ["READ_NOTHING_BYTES", "breakdown", "within_noise"]

READ_NOTHING_BYTES = (
    1 << 20
)  # a cold epoch that read less than this, and less than 1% of its data, read nothing


def breakdown(runs: Mapping[str, RunRecord], data_bytes: int | None = None) -> Breakdown:
    """The steady cold epoch of ``runs`` ("ingestion", "prep", "cold") split; ``data_bytes``: the bytes an
    epoch covers (device bytes), to judge what reading next to nothing is."""
    cold = steady(list(runs["cold"].epochs))
    warm = steady(list(runs["prep"].epochs))
    alone = steady(list(runs["ingestion"].epochs))
    warm_wait = [_wait(e) / max(e.batches, 1) for e in warm]  # per batch: the runs' epochs may differ
    fetch = [_fetch(e, fmean(warm_wait), data_bytes) for e in cold]
    wait = [_wait(e) for e in cold]
    inside = [_transitions(e.transitions) for e in cold]
    made = _per_epoch(inside)
    compute = [
        e.seconds - w - sum(s for s, _ in t.values()) for e, w, t in zip(cold, wait, inside, strict=True)
    ]
    batches = fmean(e.batches for e in cold)
    step_alone = fmean(e.step_seconds / max(e.batches, 1) for e in alone) * batches
    step_cpu = _per_batch(alone, "cpu_seconds") * batches
    first = runs["cold"].epochs[0].seconds
    epoch = fmean(e.seconds for e in cold)
    return Breakdown(
        epoch_seconds=epoch,
        compute_seconds=fmean(compute),
        prep_stall_seconds=fmean(w - f for w, f in zip(wait, fetch, strict=True)),
        fetch_stall_seconds=fmean(fetch),
        warmup_seconds=max(0.0, first - epoch) if len(runs["cold"].epochs) > 1 else 0.0,
        contention_seconds=max(0.0, fmean(compute) - step_alone),
        wait_seconds=fmean(wait),
        step_alone_seconds=step_alone,
        warm_epoch_seconds=fmean(e.seconds for e in warm),
        warm_first_batch_seconds=fmean(e.first_batch_seconds for e in warm),
        step_cpu_seconds=step_cpu,
        prep_cpu_seconds=max(0.0, _per_batch(warm, "cpu_seconds") * batches - step_cpu),
        epoch_spread_seconds=_half_range([e.seconds for e in cold]),
        compute_spread_seconds=_half_range(compute),
        prep_stall_spread_seconds=_half_range([w - f for w, f in zip(wait, fetch, strict=True)])
        + _half_range(warm_wait) * fmean(e.batches for e in cold),
        fetch_stall_spread_seconds=_half_range(fetch)
        + _half_range(warm_wait) * fmean(e.batches for e in cold),
        transitions=made,
        transitions_between=_per_epoch([_transitions(e.transitions_before) for e in cold]),
        warmup_transitions=_beyond(runs["cold"].epochs[0], made, max(0.0, first - epoch))
        if len(runs["cold"].epochs) > 1
        else {},
        **_wait_spread(runs["cold"].timeline),
    )


def within_noise(a: float, a_spread: float, b: float, b_spread: float) -> bool:
    """Whether ``a`` and ``b`` differ by no more than their spreads together."""
    return abs(a - b) <= a_spread + b_spread


def _per_batch(epochs: Sequence[EpochRecord], name: str) -> float:
    return fmean(getattr(e, name) / max(e.batches, 1) for e in epochs)


def _wait(e: EpochRecord) -> float:
    return min(max(e.wait_seconds, 0.0), e.seconds)


def _fetch(e: EpochRecord, warm_wait_per_batch: float, data_bytes: int | None) -> float:
    """What the cold epoch ``e`` waited beyond the warm run's wait for as many batches; none where it read
    next to nothing from storage."""
    if _read_nothing(e.storage_bytes, data_bytes):
        return 0.0
    return min(_wait(e), max(0.0, _wait(e) - warm_wait_per_batch * e.batches))


def _read_nothing(storage_bytes: int, data_bytes: int | None) -> bool:
    floor = READ_NOTHING_BYTES if data_bytes is None else min(READ_NOTHING_BYTES, data_bytes // 100)
    return storage_bytes < max(floor, 1)


def _transitions(made: Mapping[str, Sequence[float]]) -> dict[str, tuple[float, float]]:
    return {kind: (float(seconds), float(count)) for kind, (seconds, count) in made.items()}


def _per_epoch(epochs: Sequence[Mapping[str, tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """Per kind, the mean seconds and count over ``epochs`` (an epoch without it counting 0)."""
    kinds = sorted({kind for made in epochs for kind in made})
    return {
        kind: (
            fmean(made.get(kind, (0.0, 0.0))[0] for made in epochs),
            fmean(made.get(kind, (0.0, 0.0))[1] for made in epochs),
        )
        for kind in kinds
    }


def _beyond(
    first: EpochRecord, steady_made: Mapping[str, tuple[float, float]], warmup: float
) -> dict[str, tuple[float, float]]:
    """The transitions the first epoch made beyond a steady one's, per kind, where it made more of them
    (``torch.compile``'s first compilations): part of the warm-up, so never more than its ``warmup``."""
    made = _transitions(first.transitions)
    beyond = {}
    for kind, (seconds, count) in made.items():
        steady_seconds, steady_count = steady_made.get(kind, (0.0, 0.0))
        if count > steady_count:
            beyond[kind] = (min(warmup, max(0.0, seconds - steady_seconds)), count - steady_count)
    return beyond


def _wait_spread(timeline: Sequence[tuple[float, float]]) -> dict[str, float]:
    """The batch wait's p50, p90, p99 and max over a run's last epoch, its first batch (workers starting)
    left out: a few slow samples show as a p99 or max far above the p50, and as slow batches
    (``slow_samples``)."""
    waits = np.array([wait for wait, _ in timeline[1:]], dtype=float)
    if not len(waits):
        return {}
    p50, p90, p99 = np.percentile(waits, [50, 90, 99])
    return {
        "batch_wait_p50_seconds": float(p50),
        "batch_wait_p90_seconds": float(p90),
        "batch_wait_p99_seconds": float(p99),
        "batch_wait_max_seconds": float(waits.max()),
        **slow_batches(waits, float(p50)),
    }


def _half_range(values: Sequence[float]) -> float:
    """Half the range of ``values``; NaN (unknown, not zero) for a single one."""
    return (max(values) - min(values)) / 2 if len(values) > 1 else math.nan
