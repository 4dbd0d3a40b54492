"""Useful work of a steady epoch: what the epoch's time and energy bought, beside how long it took.

A faster epoch is no gain if it carries more padding, repeats examples or makes fewer updates, so a report
counts, per steady epoch of the cold run: optimizer updates (the ``optimizer.step()`` calls of a command that
made any, so gradient accumulation and AMP's skipped steps count as made; else one per batch), unique
examples, and for token data the valid tokens (the examples' own) against the token slots the batches
carried (padding included), each also per second; and the energy the epoch used, per epoch and per unit of
work (``stallbench.energy``: a counter's reading where the job could read one, else an estimate from the
job's CPU seconds, labelled ``"estimate"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import TYPE_CHECKING

from stallbench.energy import ESTIMATE, estimate_joules

if TYPE_CHECKING:
    from stallbench.analysis.results import EpochRecord

__all__ = ["TimeToTarget", "UsefulWork", "useful_work"]


@dataclass(frozen=True)
class TimeToTarget:
    """What the user's command's ``stallbench.time_to_target`` said (``stallbench.target.TargetResult``)."""

    target: float
    reached: bool
    seconds: float  # from the start of training to the evaluation that reached it, evaluations included
    epochs: int
    updates: int
    value: float  # that evaluation's result


@dataclass(frozen=True)
class UsefulWork:
    """Per steady epoch of the cold run (a mean over epochs 2..), and per second of it."""

    packing: str | None  # the packing algorithm of this run; None: the loader's own batches (padded tokens)
    pack_len: int | None  # tokens per pack at most, with packing
    updates: float  # optimizer updates: optimizer.step() calls where counted, else one per batch
    updates_per_s: float
    unique_samples: float | None  # distinct examples the epoch's order handed out; None: not counted
    valid_tokens: float | None  # the examples' own tokens; None: not token batches
    token_slots: float | None  # token positions the batches carried, padding included
    valid_tokens_per_s: float | None
    token_slots_per_s: float | None
    padding_fraction: float | None  # 1 - valid_tokens / token_slots
    energy_joules: float
    energy_source: str  # "rapl", "nvml", "rapl+nvml", or "estimate" (from CPU seconds)
    joules_per_1k_tokens: float | None  # per 1,000 valid tokens
    joules_per_sample: float
    time_to_target: TimeToTarget | None = (
        None  # the cold run's ``stallbench.time_to_target``, if it called it
    )


def _mean(values: Sequence[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else fmean(values)  # type: ignore[arg-type]


def _per(amount: float | None, per: float | None, scale: float = 1.0) -> float | None:
    return amount / per * scale if amount is not None and per else None


def _energy(epochs: Sequence[EpochRecord]) -> tuple[float, str]:
    """Measured joules where every epoch has them (all from one meter), else the CPU-time estimate."""
    measured = _mean([e.energy_joules for e in epochs])
    if measured is not None:
        return measured, epochs[0].energy_source or ESTIMATE
    return estimate_joules(fmean(e.cpu_seconds for e in epochs)), ESTIMATE


def _time_to_target(reported: dict | None) -> TimeToTarget | None:
    if not reported:
        return None
    return TimeToTarget(**{f: reported[f] for f in TimeToTarget.__dataclass_fields__})


def useful_work(
    epochs: Sequence[EpochRecord],
    packing: str | None = None,
    pack_len: int | None = None,
    target: dict | None = None,
) -> UsefulWork:
    """The useful work of ``epochs``, a cold run's steady ones; ``target``: what the run's own
    ``stallbench.time_to_target`` said (the user's command only)."""
    kept = list(epochs)
    seconds = fmean(e.seconds for e in kept)
    valid, slots = _mean([e.valid_tokens for e in kept]), _mean([e.token_slots for e in kept])
    joules, source = _energy(kept)
    updates = fmean(e.batches if e.optimizer_steps is None else e.optimizer_steps for e in kept)
    return UsefulWork(
        packing=packing,
        pack_len=pack_len,
        updates=updates,
        updates_per_s=updates / seconds if seconds > 0 else float("nan"),
        unique_samples=_mean([e.unique_samples for e in kept]),
        valid_tokens=valid,
        token_slots=slots,
        valid_tokens_per_s=_per(valid, seconds),
        token_slots_per_s=_per(slots, seconds),
        padding_fraction=1 - valid / slots if valid is not None and slots else None,
        energy_joules=joules,
        energy_source=source,
        joules_per_1k_tokens=_per(joules, valid, 1000),
        joules_per_sample=_per(joules, fmean(e.samples for e in kept)) or float("nan"),
        time_to_target=_time_to_target(target),
    )
