"""Slow ranks: under torchrun every step ends at a collective (DDP's gradient all-reduce, or one the script
calls), which no rank leaves before the last one reaches it. A rank whose batch comes late holds every other
rank there, so its data wait is everyone's stall.

From each rank's timeline of its last epoch (per batch: the wait for it, then the step), step ``k``'s late
rank is the one that waited longest for its batch, and each other rank is taken to wait at the step's
collective for the difference of the two waits: the ranks' steps are the same work, and the collective
before the step started them together. A rank is never said to have waited there longer than its step took
beyond the quickest rank's step, which holds that wait: ranks that share no collective (independent jobs
under one launcher) show none. Written by hand: no profiler attributes a collective's wait to another
rank's data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["RankWaits", "rank_waits"]


@dataclass(frozen=True)
class RankWaits:
    """What one rank's last epoch spent at the collectives because of the ranks' data."""

    waits_for_others_seconds: float  # it waited at the collectives for another rank's batch
    holds_others_seconds: float  # the others waited there for its batch (their mean)


def rank_waits(timelines: Mapping[int, Sequence[tuple[float, float]]]) -> dict[int, RankWaits]:
    """Per rank, its ``RankWaits`` from each rank's ``timelines`` ((wait, step) per batch, in order), over
    the batches every rank made; none for a single rank."""
    ranks = sorted(timelines)
    if len(ranks) < 2:
        return {}
    waits_for = dict.fromkeys(ranks, 0.0)
    holds = dict.fromkeys(ranks, 0.0)
    for k in range(min(len(timelines[r]) for r in ranks)):
        waits = {r: timelines[r][k][0] for r in ranks}
        late = max(ranks, key=waits.__getitem__)
        quickest = min(timelines[r][k][1] for r in ranks)
        held = {r: min(waits[late] - waits[r], timelines[r][k][1] - quickest) for r in ranks if r != late}
        for r, seconds in held.items():
            waits_for[r] += max(0.0, seconds)
        holds[late] += sum(max(0.0, s) for s in held.values()) / len(held)
    return {r: RankWaits(waits_for[r], holds[r]) for r in ranks}
