"""What a profiled loop's epochs derive: per-iteration timeline, epoch rows, steady state, transitions.

Each epoch is measured by the bootstrap's own meter (``stallbench.jobs._timed``: the one timing layer at the
iterator's boundary, for ``stallbench.profile``, its pytest fixture and ``stallbench analyze``): a batch
waits from the ``__next__`` call to its return (the first from ``iter()``) and steps from that return to
the next call (or to the epoch's ``end`` when the loop left early), less the marked phases that began in
it (``jobs._transitions``). Here the meters' figures are read after the fact; a gap between two epochs is
less the phases inside it.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

import numpy as np

from stallbench.jobs._timed import EpochMeter

__all__ = [
    "PhaseRecord",
    "ProfiledEpoch",
    "Timeline",
    "epoch_rows",
    "steady_state",
    "timeline",
    "transitions",
]


@dataclasses.dataclass
class ProfiledEpoch:
    """One ``for`` over the profiler: its meter, and how it ended; readable at any time."""

    meter: EpochMeter
    end: float | None = None  # when the epoch's iterator finished (exhausted, break, error); None: open
    exhausted: bool = False  # the loader raised StopIteration
    end_wait: float | None = None  # seconds inside the final ``__next__`` that raised it


@dataclasses.dataclass(frozen=True)
class PhaseRecord:
    name: str
    start: float
    end: float


class Timeline(NamedTuple):
    """One entry per batch; ``step_s`` is NaN for a step that has not ended (its epoch is still open)."""

    epoch: np.ndarray
    index: np.ndarray
    wait_s: np.ndarray
    step_s: np.ndarray


def _iterations(epoch: ProfiledEpoch) -> tuple[np.ndarray, np.ndarray]:
    """Wait and step seconds of each batch of one epoch (a step not ended yet: NaN)."""
    meter = epoch.meter
    waits, steps = np.array(meter.batch_waits, dtype=float), np.array(meter.batch_steps, dtype=float)
    return waits, np.append(steps, [np.nan] * (len(waits) - len(steps)))


def timeline(epochs: list[ProfiledEpoch]) -> Timeline:
    parts = [_iterations(epoch) for epoch in epochs]
    sizes = [len(w) for w, _ in parts]
    return Timeline(
        epoch=np.repeat(np.arange(len(epochs)), sizes),
        index=np.concatenate([np.arange(n) for n in sizes]) if sizes else np.zeros(0, dtype=int),
        wait_s=np.concatenate([w for w, _ in parts]) if parts else np.zeros(0),
        step_s=np.concatenate([s for _, s in parts]) if parts else np.zeros(0),
    )


def epoch_rows(epochs: list[ProfiledEpoch]) -> list[dict]:
    rows = []
    for i, epoch in enumerate(epochs):
        meter = epoch.meter
        last = epoch.end if epoch.end is not None else max(meter.asked, meter.last_activity)
        rows.append(
            {
                "index": i,
                "iterations": meter.batches,
                "complete": epoch.exhausted,
                "seconds": last - meter.start,
                "wait_s": meter.wait,
                "step_s": meter.step,
                "first_batch_s": meter.first_batch if meter.batches else None,
                "end_wait_s": epoch.end_wait,
            }
        )
    return rows


def _stats(prefix: str, seconds: np.ndarray) -> dict[str, float | None]:
    values = [seconds.mean(), *np.percentile(seconds, [50, 95])] if len(seconds) else [None] * 3
    keys = (f"{prefix}_mean_s", f"{prefix}_p50_s", f"{prefix}_p95_s")
    return {k: None if v is None else float(v) for k, v in zip(keys, values, strict=True)}


def steady_state(tl: Timeline) -> dict:
    """Totals and per-iteration figures over every batch but each epoch's first (and open steps)."""
    keep = (tl.index > 0) & np.isfinite(tl.step_s)
    wait, step = tl.wait_s[keep], tl.step_s[keep]
    out: dict = {"iterations": int(keep.sum()), "wait_s": float(wait.sum()), "step_s": float(step.sum())}
    total = out["wait_s"] + out["step_s"]
    out["wait_fraction"] = out["wait_s"] / total if total > 0 else None
    out["iterations_per_s"] = out["iterations"] / total if total > 0 else None
    for prefix, seconds in (("wait", wait), ("step", step)):
        out.update(_stats(prefix, seconds))
    return out


def _gap(start: float, end: float, phases: list[PhaseRecord]) -> float:
    """``end - start`` less the marked phases inside it."""
    inside = sum(max(0.0, min(p.end, end) - max(p.start, start)) for p in phases)
    return end - start - inside


def transitions(epochs: list[ProfiledEpoch], phases: list[PhaseRecord]) -> dict:
    """First batches, epoch-end waits, gaps between epochs (less phases) and phase durations."""
    pairs = [(a.end, b.meter.start) for a, b in itertools.pairwise(epochs) if a.end is not None]
    named: dict[str, list[float]] = {}
    for p in phases:
        named.setdefault(p.name, []).append(p.end - p.start)
    return {
        "first_batch_s": [e.meter.first_batch for e in epochs if e.meter.batches],
        "epoch_gap_s": [_gap(start, end, phases) for start, end in pairs],
        "epoch_end_wait_s": [e.end_wait for e in epochs if e.end_wait is not None],
        "phases": named,
    }
