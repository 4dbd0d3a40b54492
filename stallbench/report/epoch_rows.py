"""The steady epoch's rows of the report's table: the epoch and its parts (which add up to it), each with its
spread (``± s``: half the range over the steady epochs); against the baseline, a difference no larger than
the two spreads together is said to be within noise, the headline ratio included."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stallbench.analysis.breakdown import within_noise
from stallbench.analysis.results import Breakdown, LoaderReport
from stallbench.conditions.sizes import format_bytes
from stallbench.report._cells import Cell, Ratio, Spec, finite, pct, sec
from stallbench.report.transition_rows import transition_rows, warmup_rows

__all__ = ["epoch_rows"]


Part = Callable[[Breakdown], tuple[float, float]]  # seconds and spread of one part of the epoch


def _epoch(b: Breakdown) -> tuple[float, float]:
    return b.epoch_seconds, b.epoch_spread_seconds


def _compute(b: Breakdown) -> tuple[float, float]:
    return b.compute_seconds, b.compute_spread_seconds


def _prep_stall(b: Breakdown) -> tuple[float, float]:
    return b.prep_stall_seconds, b.prep_stall_spread_seconds


def _fetch_stall(b: Breakdown) -> tuple[float, float]:
    return b.fetch_stall_seconds, b.fetch_stall_spread_seconds


def _cell(part: Part, share: bool = True) -> Cell:
    """Seconds (and % of the epoch) ± the spread."""

    def cell(r: LoaderReport) -> str:
        seconds, spread = part(r.breakdown)
        if not finite(seconds):
            return "-"
        text = f"{sec(seconds)} ({r.breakdown.percent(seconds):.1f}%)" if share else sec(seconds)
        return f"{text} ± {spread:.2f}" if finite(spread) else text

    return cell


def _noisy(base: LoaderReport, r: LoaderReport, part: Part) -> tuple[float, float] | None:
    """The two values of ``part``, or None where they are within the noise (``within_noise``)."""
    (b, b_spread), (o, o_spread) = part(base.breakdown), part(r.breakdown)
    if not (finite(b) and finite(o)):
        return None
    return None if within_noise(b, b_spread, o, o_spread) else (b, o)


STEP_MOVED = 0.25  # the steps alone of two columns this far apart: the machine's load changed between them


def _speedup(base: LoaderReport, r: LoaderReport) -> str:
    """The headline: how much faster or slower the epoch, with the range its spreads allow; "within noise"
    where the spreads cover the difference, and "busy machine, not comparable" where the steps alone (the
    ingestion run's: no loader at work) moved between the two columns, or a column's steps ran faster beside
    its loader than alone, which only other load does."""
    if _step_moved(base, r) or _load_left(base) or _load_left(r):
        return "busy machine, not comparable"
    values = _noisy(base, r, _epoch)
    if values is None:
        return "within noise"
    b, o = values
    if b <= 0 or o <= 0:
        return "-"
    b_spread, o_spread = base.breakdown.epoch_spread_seconds, r.breakdown.epoch_spread_seconds
    if b >= o:
        return f"{b / o:.2f}x faster{_range(b, b_spread, o, o_spread)}"
    return f"{o / b:.2f}x slower{_range(o, o_spread, b, b_spread)}"


def _range(top: float, top_spread: float, bottom: float, bottom_spread: float) -> str:
    """`` (low-high)``: the ratio ``top / bottom`` as far as the spreads let it move; empty where unknown."""
    if not (finite(top_spread) and finite(bottom_spread)) or bottom <= bottom_spread:
        return ""
    low, high = (top - top_spread) / (bottom + bottom_spread), (top + top_spread) / (bottom - bottom_spread)
    return "" if f"{low:.2f}" == f"{high:.2f}" else f" ({low:.2f}-{high:.2f})"


def _step_moved(a: LoaderReport, b: LoaderReport) -> bool:
    """Whether the steps alone of two runs of one job differ by more than ``STEP_MOVED``; only where both
    made the same batches an epoch (packed batches, another batch size: other steps, not other load)."""
    if _batches(a) != _batches(b):
        return False
    low, high = sorted((a.breakdown.step_alone_seconds, b.breakdown.step_alone_seconds))
    return low > 0 and high > low * (1 + STEP_MOVED)


def _load_left(r: LoaderReport) -> bool:
    """Whether the column's steps beside its loader (compute) took ``STEP_MOVED`` less than its steps alone,
    beyond compute's own spread: a loader only adds to a step (contention), so the load that slowed the
    steps alone had gone by the real run, and the headline would compare one column's load with another's
    quiet."""
    b = r.breakdown
    alone, compute = b.step_alone_seconds, b.compute_seconds
    if not (finite(compute) and compute > 0) or alone <= compute * (1 + STEP_MOVED):
        return False
    return not within_noise(alone, 0.0, compute, b.compute_spread_seconds)


def _batches(r: LoaderReport) -> tuple[int, ...]:
    """The batches of each epoch of the report's cold run."""
    return tuple(e.batches for run in r.runs if run.phase == "cold" for e in run.epochs)


def _difference(part: Part) -> Ratio:
    """The difference in seconds, or 'within noise'."""

    def ratio(base: LoaderReport, r: LoaderReport) -> str:
        values = _noisy(base, r, part)
        return "within noise" if values is None else f"{values[1] - values[0]:+.2f} s"

    return ratio


def _change(value: Callable[[LoaderReport], float]) -> Ratio:
    def ratio(base: LoaderReport, r: LoaderReport) -> str:
        b, o = value(base), value(r)
        return f"{100 * (o - b) / b:+.0f}%" if finite(b) and finite(o) and b > 0 else "-"

    return ratio


def _wait_spread(r: LoaderReport) -> str:
    b = r.breakdown
    values = (b.batch_wait_p50_seconds, b.batch_wait_p90_seconds, b.batch_wait_p99_seconds)
    values += (b.batch_wait_max_seconds,)
    if not all(map(finite, values)):
        return "-"
    return " / ".join(f"{1000 * v:.1f}" for v in values) + " ms"


def _slow_batches(r: LoaderReport) -> str:
    """How many batches waited 4x the median or more, and what they waited beyond it: a few slow samples'
    toll, in seconds and (in brackets) as a share of the epoch's wait."""
    b = r.breakdown
    if not finite(b.batch_wait_p50_seconds):
        return "-"
    if not b.slow_batches:
        return "none"
    return f"{b.slow_batches}, +{sec(b.slow_batches_excess_seconds)} ({pct(b.slow_batches_wait_share)})"


def _slow_samples(r: LoaderReport) -> str:
    """How many samples' prep took 4x their process's mean, the share of them slow the epoch before too, and
    the slowest's time (named below the table)."""
    if not r.slow_samples:
        return "none"
    slowest = 1000 * r.slow_samples[0].seconds
    return f"{r.slow_sample_count}, {pct(r.slow_again)} again (slowest {slowest:.1f} ms)"


def _storage(r: LoaderReport) -> float:
    return r.storage_bytes


def _hit_rate(r: LoaderReport) -> str:
    return pct(r.hit_rate) if finite(r.hit_rate) else "- (no read went through a cache)"


def epoch_rows(reports: Sequence[LoaderReport]) -> Spec:
    """The steady epoch's rows for these reports: its parts, then what it read and did."""
    return (
        ("steady epoch", None, None),
        ("epoch time", _cell(_epoch, share=False), _speedup),
        ("compute", _cell(_compute), _difference(_compute)),
        ("  of which contention", lambda r: sec(r.breakdown.contention_seconds), None),
        ("prep stall", _cell(_prep_stall), _difference(_prep_stall)),
        ("fetch stall", _cell(_fetch_stall), _difference(_fetch_stall)),
        *transition_rows(reports),
        ("warm-up (apart)", lambda r: sec(r.breakdown.warmup_seconds), None),
        *warmup_rows(reports),
        ("wait p50/p90/p99/max", _wait_spread, None),
        ("  slow batches (4x p50)", _slow_batches, None),
        ("  slow samples (4x mean)", _slow_samples, None),
        ("storage read", lambda r: format_bytes(r.storage_bytes), _change(_storage)),
        (
            "  of the dataset",
            lambda r: pct(r.storage_bytes / r.dataset_bytes) if r.dataset_bytes else "-",
            None,
        ),
        ("cache hit rate", _hit_rate, None),
        ("CPU utilisation", lambda r: pct(r.cpu_utilisation), None),
        ("samples/s", lambda r: f"{r.samples_per_s:,.0f}" if finite(r.samples_per_s) else "-", None),
    )
