"""One line of advice from an analysis: the stall that bounds the epoch and the setting that cuts it, with the
what-if's numbers (``stallbench.analysis.whatif``)."""

from __future__ import annotations

from stallbench.analysis.hits import cache_budget
from stallbench.analysis.results import Prediction, Workload
from stallbench.analysis.whatif import Measured, predict, roofline
from stallbench.conditions.sizes import format_bytes
from stallbench.jobs.kinds import CACHED, KINDS

__all__ = ["advise", "advised", "cache_arguments"]

ACT_ON = 10.0  # a stall under this % of the epoch is not worth acting on
MIN_GAIN = 0.02  # an action must cut the epoch by at least this fraction to be advised


def _gain(prediction: Prediction, m: Measured) -> str:
    change = 100.0 * (prediction.epoch_seconds / m.breakdown.epoch_seconds - 1.0)
    return f"{prediction.epoch_seconds:.1f} s ({change:+.0f}%)"


def _fetch_action(m: Measured, predictions: tuple[Prediction, ...]) -> tuple[Prediction, str, str] | None:
    """For torch, the cached loader at the same budget if it helps; else the best cache at these workers:
    (prediction, the action in words, the loader it runs on)."""
    worth = (1.0 - MIN_GAIN) * m.breakdown.epoch_seconds
    if not KINDS[m.loader].cached:
        cache = min(m.workload.dataset_bytes, cache_budget(m.workload.cache_bytes))
        switch = predict(m, cache_bytes=cache, workers=m.workload.workers, loader=CACHED)
        if switch.epoch_seconds < worth:
            return switch, f"{KINDS[CACHED].label} with {cache_arguments(cache, m.workload)}", CACHED
    options = [p for p in predictions if p.workers == m.workload.workers and p.epoch_seconds < worth]
    best = min(options, key=lambda p: (p.epoch_seconds, p.cache_bytes), default=None)
    if best is None:
        return None
    what = cache_arguments(best.cache_bytes, m.workload) if KINDS[m.loader].cached else "a page cache of "
    return best, what if KINDS[m.loader].cached else what + format_bytes(best.cache_bytes), m.loader


def cache_arguments(cache: int, workload: Workload) -> str:
    """The arguments as a script writes them (``cache_bytes=344_064_000``, its size beside it), with
    ``cache_files=`` the data's folders where the command's Dataset opens its own files."""
    said = f"cache_bytes={cache:_} ({format_bytes(cache)})"
    if workload.opens_own_files:
        roots = workload.data.split(",")
        said += f", cache_files={roots[0]!r}" if len(roots) == 1 else f", cache_files={roots!r}"
    return said


def _prep_action(m: Measured, predictions: tuple[Prediction, ...]) -> Prediction | None:
    """The fewest workers that give the fastest epoch, if that is worth it."""
    worth = (1.0 - MIN_GAIN) * m.breakdown.epoch_seconds
    options = [p for p in predictions if p.workers != m.workload.workers and p.epoch_seconds < worth]
    return min(options, key=lambda p: (p.epoch_seconds, p.workers), default=None)


def _dominant(m: Measured, prep: float, fetch: float) -> str:
    """The stall to act on: the one the roofline says bounds the epoch, if it was measured worth acting on;
    else the larger one measured.

    Removing a stall that is not the bound does not shorten the epoch: with fetch the bound, a faster
    decode only moves the wait from prep to fetch.
    """
    measured = {"fetch": fetch, "prep": prep}  # a tie goes to fetch
    bound = roofline(m).bound
    return bound if measured.get(bound, 0.0) >= ACT_ON else max(measured, key=measured.__getitem__)


def advised(m: Measured, predictions: tuple[Prediction, ...]) -> tuple[Prediction, str] | None:
    """The setting :func:`advise` names and the loader it runs on ("torch" or "cached"); None where the
    advice names none (no stall worth acting on, or no setting predicted faster)."""
    b = m.breakdown
    prep, fetch = b.percent(b.prep_stall_seconds), b.percent(b.fetch_stall_seconds)
    if max(prep, fetch) < ACT_ON:
        return None
    if _dominant(m, prep, fetch) == "fetch":
        action = _fetch_action(m, predictions)
        return None if action is None else (action[0], action[2])
    best = _prep_action(m, predictions)
    return None if best is None else (best, m.loader)


def _no_stall(m: Measured, stalls: float) -> str:
    """No stall to act on; where the roofline's bound is not the step alone, what it is instead: the step
    sharing the cores with prep (its contention), or storage that a faster step would meet."""
    bound = roofline(m).bound
    if bound == "compute":
        return f"no stall worth acting on: the epoch is compute-bound (stalls {stalls:.0f}%)"
    head = f"no stall worth acting on (stalls {stalls:.0f}%)"
    if bound == "prep":
        b = m.breakdown
        slower = b.contention_seconds / b.step_alone_seconds if b.step_alone_seconds > 0 else 0.0
        return (
            f"{head}, but the cores bound the epoch: the step shares {m.machine.cores} cores with prep "
            f"and ran {slower:.0%} slower than alone; a faster decode or more cores would help"
        )
    return f"{head}, but storage bounds the epoch: a faster step would wait for it"


def advise(m: Measured, predictions: tuple[Prediction, ...]) -> str:
    """One line: the stall that bounds the epoch and the action that cuts it, with numbers."""
    b = m.breakdown
    prep, fetch = b.percent(b.prep_stall_seconds), b.percent(b.fetch_stall_seconds)
    if max(prep, fetch) < ACT_ON:
        return _no_stall(m, prep + fetch)
    if _dominant(m, prep, fetch) == "fetch":
        head, action = f"fetch stall is {fetch:.0f}% of the epoch", _fetch_action(m, predictions)
        head += "" if fetch >= prep else f" and storage bounds it (prep stall {prep:.0f}% waits behind it)"
        if action is None:
            storage = format_bytes(m.machine.storage_bytes_per_s)
            return f"{head}: no larger cache predicts a faster epoch; storage reads {storage}/s"
        return f"{head}: {action[1]} would cut the epoch to {_gain(action[0], m)}"
    head, best = f"prep stall is {prep:.0f}% of the epoch", _prep_action(m, predictions)
    head += "" if prep >= fetch else f" and decode bounds it (fetch stall {fetch:.0f}% waits behind it)"
    rate = f"decode is {m.machine.prep_samples_per_s_per_core:.0f} samples/s per core"
    if best is None:
        where = f"{m.workload.workers} workers on {m.machine.cores} cores"
        return f"{head} with {where}: {rate}; more workers would not help, faster decode or more cores would"
    return f"{head}: {best.workers} workers would bring the epoch to {_gain(best, m)}; {rate}"
