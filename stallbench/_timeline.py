"""The raw timestamps of a profiled loop, and what they derive: per-iteration timeline, epochs, transitions.

Recording keeps only ``time.perf_counter()`` stamps; every duration is computed here, after the fact.
Iteration ``i`` of an epoch waits from ``calls[i]`` to ``returns[i]`` and steps from ``returns[i]`` to
``calls[i + 1]`` (or to the epoch's ``end`` when the loop left early). Time in a marked phase is taken out
of the step or epoch gap it falls in (a phase counts against the step it starts in, up to that step's end).
"""

from __future__ import annotations

import dataclasses
import itertools
from array import array
from typing import NamedTuple

import numpy as np

__all__ = ["EpochRecord", "PhaseRecord", "Timeline", "epoch_rows", "steady_state", "timeline", "transitions"]


@dataclasses.dataclass
class EpochRecord:
    """Stamps of one ``for`` over the profiler; consistent after every append, so readable at any time."""

    calls: array = dataclasses.field(default_factory=lambda: array("d"))  # each __next__ call on the loader
    returns: array = dataclasses.field(default_factory=lambda: array("d"))  # each batch returned
    end: float | None = None  # when the epoch's iterator finished (exhausted, break, error); None: open
    exhausted: bool = False  # the loader raised StopIteration


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


def _minus_phases(starts: np.ndarray, ends: np.ndarray, phases: list[PhaseRecord]) -> np.ndarray:
    """``ends - starts`` for sorted disjoint intervals, less the marked-phase time inside each."""
    seconds = ends - starts
    if phases and len(starts):
        p_start = np.array([p.start for p in phases])
        p_end = np.array([p.end for p in phases])
        idx = np.searchsorted(starts, p_start, side="right") - 1
        hit = idx >= 0
        overlap = np.clip(np.minimum(p_end[hit], ends[idx[hit]]) - p_start[hit], 0.0, None)
        np.subtract.at(seconds, idx[hit], overlap)
    return seconds


def _iterations(rec: EpochRecord, phases: list[PhaseRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Wait and step seconds of each batch of one epoch."""
    calls, returns = np.array(rec.calls, dtype=float), np.array(rec.returns, dtype=float)
    n = len(returns)
    ends = calls[1 : n + 1]
    if len(ends) < n:  # the last batch's step ended when the loop left, or is still running
        ends = np.append(ends, np.nan if rec.end is None else rec.end)
    return returns - calls[:n], _minus_phases(returns, ends, phases)


def timeline(records: list[EpochRecord], phases: list[PhaseRecord]) -> Timeline:
    parts = [_iterations(rec, phases) for rec in records]
    sizes = [len(w) for w, _ in parts]
    return Timeline(
        epoch=np.repeat(np.arange(len(records)), sizes),
        index=np.concatenate([np.arange(n) for n in sizes]) if sizes else np.zeros(0, dtype=int),
        wait_s=np.concatenate([w for w, _ in parts]) if parts else np.zeros(0),
        step_s=np.concatenate([s for _, s in parts]) if parts else np.zeros(0),
    )


def _end_wait(rec: EpochRecord) -> float | None:
    """Seconds inside the final __next__ that raised StopIteration."""
    return rec.end - rec.calls[-1] if rec.exhausted and rec.end is not None else None


def epoch_rows(records: list[EpochRecord], phases: list[PhaseRecord]) -> list[dict]:
    rows = []
    for i, rec in enumerate(records):
        wait, step = _iterations(rec, phases)
        last = rec.end if rec.end is not None else max(rec.calls[-1], rec.returns[-1] if rec.returns else 0.0)
        rows.append(
            {
                "index": i,
                "iterations": len(wait),
                "complete": rec.exhausted,
                "seconds": last - rec.calls[0],
                "wait_s": float(wait.sum()),
                "step_s": float(np.nansum(step)),
                "first_batch_s": float(wait[0]) if len(wait) else None,
                "end_wait_s": _end_wait(rec),
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


def transitions(records: list[EpochRecord], phases: list[PhaseRecord]) -> dict:
    """First batches, epoch-end waits, gaps between epochs (less phases) and phase durations."""
    pairs = [(a.end, b.calls[0]) for a, b in itertools.pairwise(records) if a.end is not None]
    gaps = _minus_phases(np.array([s for s, _ in pairs]), np.array([e for _, e in pairs]), phases)
    named: dict[str, list[float]] = {}
    for p in phases:
        named.setdefault(p.name, []).append(p.end - p.start)
    return {
        "first_batch_s": [r.returns[0] - r.calls[0] for r in records if r.returns],
        "epoch_gap_s": [float(g) for g in gaps],
        "epoch_end_wait_s": [w for w in map(_end_wait, records) if w is not None],
        "phases": named,
    }
