"""Predictions for another cache size or worker count, the data roofline, and one line of advice.

The model of a steady epoch has three terms, each the time one stage alone would take:

* compute: ``T1``, the steps of an ingestion epoch (every batch already made: the step alone);
* prep: the prep run's epoch ``T3`` (all records in memory) scaled by ``cores used then / cores used``, where
  prep bounded that run; where compute hid it, ``samples / (prep rate per core * cores used)`` from the
  per-core rate measured on one core (cores used: ``min(max(workers, 1), cores)``);
* fetch: ``(1 - hit rate) * dataset_bytes / storage bandwidth`` (measured, inside the run's limits), in
  device bytes throughout (whole pages, what the kernel reads and counts). The hit rate of a steady epoch is
  ``min(1, C / record_bytes)`` for the cached loader (MinIO, the optimum under random order; it stores the
  records packed) and the simulated LRU rate (``simulate("lru")``, epoch 2) of ``C / dataset_bytes`` for the
  OS page cache of the torch loader (it holds whole pages). A budget of None means the page cache of the
  memory available now: all hits when the dataset fits.

The stages overlap, so the model epoch is the largest term, and that term names the bound (the data
roofline; its efficiency is model / measured epoch, at most 1: a model above the measured epoch, which
only noise in the measurements can make, is kept as ``bound_ratio``). A prediction is calibrated on the
measured point: ``predicted = max(T1, T2 * model(other) / model(measured))``, which reproduces the measured
``T2`` exactly and is never faster than the ingestion rate.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import psutil

from stallbench.analysis.results import Breakdown, Machine, Prediction, PrefetchPrediction, Roofline, Workload
from stallbench.jobs.kinds import CACHED, KINDS, check_kind
from stallbench.simulate import simulate

__all__ = [
    "Measured",
    "advise",
    "advised",
    "epoch_terms",
    "hit_rate",
    "predict",
    "prefetch_what_if",
    "roofline",
    "what_if",
]

Loader = str  # a kind of ``stallbench.jobs.kinds``
CACHE_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
WORKER_COUNTS = (1, 2, 4, 8)
PREFETCH_FACTORS = (1, 2, 4, 8)
ACT_ON = 10.0  # a stall under this % of the epoch is not worth acting on
MIN_GAIN = 0.02  # an action must cut the epoch by at least this fraction to be advised


@dataclass(frozen=True)
class Measured:
    """What an analysis measured for one loader: the inputs of every function here."""

    workload: Workload
    breakdown: Breakdown  # compute_seconds = T1 (ingestion), epoch_seconds = T2 (cold, steady)
    machine: Machine
    loader: Loader
    storage_bytes: int | None = None  # measured per steady epoch (kernel count); None: use the model alone

    def __post_init__(self) -> None:
        check_kind(self.loader)
        figures = {
            "breakdown.epoch_seconds": self.breakdown.epoch_seconds,
            "machine.cores": self.machine.cores,
            "machine.storage_bytes_per_s": self.machine.storage_bytes_per_s,
            "machine.prep_samples_per_s_per_core": self.machine.prep_samples_per_s_per_core,
            "workload.samples": self.workload.samples,
            "workload.dataset_bytes": self.workload.dataset_bytes,
            "workload.record_bytes": self.workload.record_bytes,
        }
        for name, value in figures.items():
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")


def _budget(cache_bytes: int | None) -> int:
    """The memory a cache has: ``cache_bytes``, or for None the memory available now."""
    return psutil.virtual_memory().available if cache_bytes is None else cache_bytes


@functools.lru_cache(maxsize=256)
def _lru_hit_rate(dataset_bytes: int, samples: int, cache_bytes: int) -> float:
    """The page cache's rate: ``dataset_bytes`` are device bytes already, so no page rounding is added."""
    record = max(1, dataset_bytes // samples)
    result = simulate(
        "lru",
        dataset_bytes=dataset_bytes,
        cache_bytes=cache_bytes,
        record_bytes=record,
        epochs=2,
        max_records=50_000,
        page_bytes=1,
    )
    return result.epochs[-1].hit_rate


def hit_rate(
    loader: Loader,
    *,
    dataset_bytes: int,
    samples: int,
    cache_bytes: int | None,
    record_bytes: int | None = None,
) -> float:
    """Fraction of a steady epoch's reads served from memory (see the module docstring).

    ``dataset_bytes`` are device bytes (whole pages: what the page cache holds); ``record_bytes`` the
    records' own bytes (what the cached loader holds), ``dataset_bytes`` when not given."""
    kind = check_kind(loader)
    if cache_bytes is not None and cache_bytes < 0:
        raise ValueError(f"cache_bytes must not be negative, got {cache_bytes!r}")
    if kind.cached and cache_bytes is not None:
        return min(1.0, cache_bytes / (record_bytes or dataset_bytes))
    budget = _budget(cache_bytes)
    return 1.0 if budget >= dataset_bytes else _lru_hit_rate(dataset_bytes, samples, budget)


def epoch_terms(
    m: Measured, *, cache_bytes: int | None, workers: int, loader: Loader | None = None
) -> dict[str, float]:
    """Seconds of a steady epoch per stage, ``{"compute", "prep", "fetch"}``, for this configuration."""
    w = m.workload
    return {
        "compute": m.breakdown.compute_seconds,
        "prep": _prep_seconds(m, workers),
        "fetch": _miss_fraction(m, cache_bytes, loader or m.loader)
        * w.dataset_bytes
        / m.machine.storage_bytes_per_s,
    }


def _prep_seconds(m: Measured, workers: int) -> float:
    """Prep time of an epoch with ``workers``: the prep run's epoch (T3) where prep bounded it, scaled by
    cores; where compute hid it (no prep stall), the per-core rate measured on one core."""
    cores = min(max(workers, 1), m.machine.cores)
    b = m.breakdown
    if b.prep_stall_seconds > 0:
        measured_cores = min(max(m.workload.workers, 1), m.machine.cores)
        return (b.compute_seconds + b.prep_stall_seconds) * measured_cores / cores
    return m.workload.samples / (m.machine.prep_samples_per_s_per_core * cores)


def _model_miss(m: Measured, cache_bytes: int | None, loader: Loader) -> float:
    w = m.workload
    hits = hit_rate(
        loader,
        dataset_bytes=w.dataset_bytes,
        samples=w.samples,
        cache_bytes=cache_bytes,
        record_bytes=w.record_bytes,
    )
    return 1.0 - hits


def _miss_fraction(m: Measured, cache_bytes: int | None, loader: Loader) -> float:
    """The model's miss fraction, scaled so that the measured configuration gives the measured bytes.

    The OS page cache of a job gets its budget plus whatever the job leaves unused of its memory limit, so
    the measured storage bytes, not the model, say how it did; other budgets keep the model's proportion.
    """
    model = _model_miss(m, cache_bytes, loader)
    if m.storage_bytes is None or loader != m.loader:
        return model
    measured = min(1.0, m.storage_bytes / m.workload.dataset_bytes)
    at_measured = _model_miss(m, m.workload.cache_bytes, loader)
    return min(1.0, model * measured / at_measured) if at_measured > 0 else model


def _bound(terms: dict[str, float]) -> str:
    return max(terms, key=terms.__getitem__)  # a tie goes to the first: compute, then prep


def roofline(m: Measured) -> Roofline:
    """The data roofline of the measured configuration; efficiency = bound / measured epoch, at most 1.

    Each term is a part of the measured epoch's work timed alone, in the same units (the steps, the prep
    run or the one-core prep rate, the device bytes the cold run read at the device bytes per second the
    storage gave as many readers as the job has workers), so a term can pass the epoch only by the noise
    of those measurements: then efficiency is 1 and ``bound_ratio`` keeps the ratio as measured."""
    terms = epoch_terms(m, cache_bytes=m.workload.cache_bytes, workers=m.workload.workers)
    bound = _bound(terms)
    ratio = terms[bound] / m.breakdown.epoch_seconds
    return Roofline(
        compute_seconds=terms["compute"],
        prep_seconds=terms["prep"],
        fetch_seconds=terms["fetch"],
        bound=bound,
        efficiency=min(1.0, ratio),
        bound_ratio=ratio,
    )


def predict(
    m: Measured, *, cache_bytes: int | None, workers: int, loader: Loader | None = None
) -> Prediction:
    """Steady epoch of ``loader`` (default: the measured one) with ``cache_bytes`` and ``workers``."""
    here = epoch_terms(m, cache_bytes=m.workload.cache_bytes, workers=m.workload.workers)
    there = epoch_terms(m, cache_bytes=cache_bytes, workers=workers, loader=loader)
    seconds = m.breakdown.epoch_seconds * (max(there.values()) / max(here.values()))
    compute = m.breakdown.compute_seconds
    bound = "compute" if seconds <= compute else _bound(there)
    return Prediction(_budget(cache_bytes), workers, max(compute, seconds), bound)


def what_if(m: Measured) -> tuple[Prediction, ...]:
    """Cache sizes of 1/4 to 1 of the dataset at the measured workers, 1, 2, 4, 8 workers at the measured
    cache, and the measured point; deduplicated, sorted by (cache_bytes, workers)."""
    cache, workers = _budget(m.workload.cache_bytes), m.workload.workers
    caches = {round(f * m.workload.dataset_bytes) for f in CACHE_FRACTIONS} | {cache}
    points = {(c, workers) for c in caches} | {(cache, w) for w in {*WORKER_COUNTS, workers}}
    return tuple(predict(m, cache_bytes=c, workers=w) for c, w in sorted(points))


def prefetch_what_if(m: Measured) -> tuple[PrefetchPrediction, ...]:
    """``prefetch_factor`` 1, 2, 4, 8 and the measured one, at the measured workers and cache (none
    without workers). The stages overlap as soon as each worker has one batch in flight, so no term of the
    model depends on the depth: every factor predicts the measured point. A deeper prefetch only absorbs
    jitter (measured on the example, prep-bound: 1 to 4 moved the epoch 0.5-3%, unthrottled decode 4-10%)."""
    if m.workload.workers == 0:
        return ()
    here = predict(m, cache_bytes=m.workload.cache_bytes, workers=m.workload.workers)
    factors = {*PREFETCH_FACTORS, m.workload.prefetch_factor or 2}
    return tuple(PrefetchPrediction(f, here.epoch_seconds, here.bound) for f in sorted(factors))


def _size(nbytes: float) -> str:
    scale, unit = next(((f, u) for f, u in ((1e9, "GB"), (1e6, "MB")) if nbytes >= f), (1e3, "KB"))
    return f"{nbytes / scale:.1f} {unit}"


def _gain(prediction: Prediction, m: Measured) -> str:
    change = 100.0 * (prediction.epoch_seconds / m.breakdown.epoch_seconds - 1.0)
    return f"{prediction.epoch_seconds:.1f} s ({change:+.0f}%)"


def _fetch_action(m: Measured, predictions: tuple[Prediction, ...]) -> tuple[Prediction, str, str] | None:
    """For torch, the cached loader at the same budget if it helps; else the best cache at these workers:
    (prediction, the action in words, the loader it runs on)."""
    worth = (1.0 - MIN_GAIN) * m.breakdown.epoch_seconds
    if not KINDS[m.loader].cached:
        cache = min(m.workload.dataset_bytes, _budget(m.workload.cache_bytes))
        switch = predict(m, cache_bytes=cache, workers=m.workload.workers, loader=CACHED)
        if switch.epoch_seconds < worth:
            return switch, f"{KINDS[CACHED].label} with cache_bytes={_size(cache)}", CACHED
    options = [p for p in predictions if p.workers == m.workload.workers and p.epoch_seconds < worth]
    best = min(options, key=lambda p: (p.epoch_seconds, p.cache_bytes), default=None)
    what = "cache_bytes=" if KINDS[m.loader].cached else "a page cache of "
    return None if best is None else (best, what + _size(best.cache_bytes), m.loader)


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


def advise(m: Measured, predictions: tuple[Prediction, ...]) -> str:
    """One line: the stall that bounds the epoch and the action that cuts it, with numbers."""
    b = m.breakdown
    prep, fetch = b.percent(b.prep_stall_seconds), b.percent(b.fetch_stall_seconds)
    if max(prep, fetch) < ACT_ON:
        return f"no stall worth acting on: the epoch is compute-bound (stalls {prep + fetch:.0f}%)"
    if _dominant(m, prep, fetch) == "fetch":
        head, action = f"fetch stall is {fetch:.0f}% of the epoch", _fetch_action(m, predictions)
        head += "" if fetch >= prep else f" and storage bounds it (prep stall {prep:.0f}% waits behind it)"
        if action is None:
            storage = _size(m.machine.storage_bytes_per_s)
            return f"{head}: no larger cache predicts a faster epoch; storage reads {storage}/s"
        return f"{head}: {action[1]} would cut the epoch to {_gain(action[0], m)}"
    head, best = f"prep stall is {prep:.0f}% of the epoch", _prep_action(m, predictions)
    head += "" if prep >= fetch else f" and decode bounds it (fetch stall {fetch:.0f}% waits behind it)"
    rate = f"decode is {m.machine.prep_samples_per_s_per_core:.0f} samples/s per core"
    if best is None:
        where = f"{m.workload.workers} workers on {m.machine.cores} cores"
        return f"{head} with {where}: {rate}; more workers would not help, faster decode or more cores would"
    return f"{head}: {best.workers} workers would bring the epoch to {_gain(best, m)}; {rate}"
