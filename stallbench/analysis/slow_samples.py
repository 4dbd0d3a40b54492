"""A few slow samples' toll: the batches of an epoch that waited several times the median, what they waited
beyond it, and, where they make most of a stall, what to say of it. A slow pipeline makes every batch wait;
a few slow samples make a few batches wait long (head-of-line blocking: torch hands batches out in order),
which more workers or a cache barely move and ``loader.DataLoader(ready_first=True)`` does."""

from __future__ import annotations

import numpy as np

from stallbench.analysis.whatif import Measured
from stallbench.jobs.kinds import CACHED, KINDS

__all__ = ["SLOW_AGAIN", "SLOW_BATCH", "SLOW_BATCH_FLOOR", "SLOW_SHARE", "slow_batches", "slow_samples_said"]

SLOW_BATCH = 4.0  # a batch that waited this many times the median is a slow one: a few slow samples' doing
SLOW_BATCH_FLOOR = 0.001  # and at least this long: 4x a wait of microseconds is no toll
SLOW_SHARE = 0.5  # slow batches that make this share of the wait are a few slow samples' doing
SLOW_AGAIN = 0.5  # when this share of the slow samples was slow the epoch before too (else: chance, load)


def slow_batches(waits: np.ndarray, median: float) -> dict[str, float]:
    """Of ``waits`` (one per batch), the slow batches: how many, what they waited beyond ``median`` and its
    share of all the wait (``Breakdown``'s ``slow_batches*`` fields)."""
    slow = waits[waits >= max(SLOW_BATCH * median, SLOW_BATCH_FLOOR)]
    excess = float((slow - median).sum())
    total = float(waits.sum())
    return {
        "slow_batches": len(slow),
        "slow_batches_excess_seconds": excess,
        "slow_batches_wait_share": excess / total if total > 0 else 0.0,
    }


def slow_samples_said(m: Measured) -> str:
    """``; N slow batches ... make X% of the wait: ...`` where they make ``SLOW_SHARE`` of it or more and
    the same samples were slow epoch after epoch (``SLOW_AGAIN``: the data's, not a busy machine's),
    naming ``ready_first=True`` (our loader's), or, where the loader had it on, saying that what is left
    is the slow samples' own prep."""
    b = m.breakdown
    if b.slow_batches_wait_share < SLOW_SHARE or m.slow_again < SLOW_AGAIN:
        return ""
    share = b.slow_batches_wait_share
    said = f"; {b.slow_batches} slow batches (4x the median wait) make {share:.0%} of the wait"
    if m.ready_first:
        return f"{said}, with ready_first=True on: the slow samples' own prep is what is left"
    setting = "ready_first=True" if KINDS[m.loader].cached else f"{KINDS[CACHED].label} with ready_first=True"
    return f"{said}: a few slow samples hold their batches, which {setting} keeps them from"
