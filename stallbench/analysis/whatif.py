"""Predictions for another cache size or worker count, and the data roofline.

The advice built on them is in ``stallbench.analysis.advice``, the hit rates in ``stallbench.analysis.hits``.

The model of a steady epoch has three terms, each the time one stage alone would take:

* compute: ``T1``, the steps of an ingestion epoch (every batch already made: the step alone);
* prep: the time the workers take for an epoch's prep, from the CPU the runs counted and the time prep
  spends off the CPU (``stallbench.analysis.prep_term``), so a step that holds a core is not mistaken for
  prep that more workers would speed up;
* fetch: ``(1 - hit rate) * dataset_bytes / storage bandwidth`` (measured, inside the run's limits), in
  device bytes throughout (whole pages, what the kernel reads and counts). The hit rate of a steady epoch is
  ``min(1, C / record_bytes)`` for the cached loader (MinIO, the optimum under random order; it stores the
  records packed) and the simulated LRU rate (``simulate("lru")``, epoch 2) of ``C / dataset_bytes`` for the
  OS page cache of the torch loader (it holds whole pages; none for data fetched over the network, from
  object storage). A budget of None means the page cache of the memory available now: all hits when the
  dataset fits.

The stages overlap, so the model epoch is the largest term, and that term names the bound (the data
roofline; its efficiency is model / measured epoch, at most 1: a model above the measured epoch, which
only noise in the measurements can make, is kept as ``bound_ratio``). A prediction is calibrated on the
measured point: ``predicted = X + max(T1, (T2 - X) * model(other) / model(measured))``, ``X`` the epoch's
transitions (evaluations, checkpoint writes: no loader setting moves them), which reproduces the measured
``T2`` exactly and is never faster than the ingestion rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallbench.analysis.hits import Loader, cache_budget, hit_rate
from stallbench.analysis.prep_term import prep_seconds
from stallbench.analysis.request import local_files
from stallbench.analysis.results import (
    Breakdown,
    FormPrediction,
    Machine,
    Prediction,
    PrefetchPrediction,
    Roofline,
    RunRecord,
    Workload,
)
from stallbench.jobs.kinds import check_kind

__all__ = [
    "Measured",
    "epoch_terms",
    "form_what_if",
    "predict",
    "prefetch_what_if",
    "roofline",
    "what_if",
]

CACHE_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
WORKER_COUNTS = (1, 2, 4, 8)
PREFETCH_FACTORS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Measured:
    """What an analysis measured for one loader: the inputs of every function here."""

    workload: Workload
    breakdown: Breakdown  # step_alone_seconds = T1, warm_epoch_seconds = T3, epoch_seconds = T2
    machine: Machine
    loader: Loader
    storage_bytes: int | None = None  # measured per steady epoch (kernel count); None: use the model alone
    cpu_seconds: float | None = None  # measured per steady epoch, the job and its workers; None: not known
    ready_first: bool = False  # the loader made batches of the samples ready first
    slow_again: float = 0.0  # the share of the last epoch's slow-sample time repeating the epoch before's
    prep_other_load: float = 0.0  # cores other work on the machine kept busy during the prep run

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


def epoch_terms(
    m: Measured, *, cache_bytes: int | None, workers: int, loader: Loader | None = None
) -> dict[str, float]:
    """Seconds of a steady epoch per stage, ``{"compute", "prep", "fetch"}``, for this configuration."""
    w = m.workload
    return {
        "compute": m.breakdown.step_alone_seconds,
        "prep": prep_seconds(m, workers),
        "fetch": _miss_fraction(m, cache_bytes, loader or m.loader)
        * w.dataset_bytes
        / m.machine.storage_bytes_per_s,
    }


def _model_miss(m: Measured, cache_bytes: int | None, loader: Loader) -> float:
    w = m.workload
    sizes = dict(dataset_bytes=w.dataset_bytes, samples=w.samples, record_bytes=w.record_bytes)
    return 1.0 - hit_rate(loader, cache_bytes=cache_bytes, over_network=not local_files(w.data), **sizes)


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
    """The data roofline of the measured configuration; efficiency = bound / measured epoch (less its
    transitions, which no term of the roofline covers), at most 1.

    Each term is a part of the measured epoch's work timed alone, in the same units (the steps, the prep
    run or the one-core prep rate, the device bytes the cold run read at the device bytes per second the
    storage gave as many readers as the job has workers), so a term can pass the epoch only by the noise
    of those measurements: then efficiency is 1 and ``bound_ratio`` keeps the ratio as measured."""
    terms = epoch_terms(m, cache_bytes=m.workload.cache_bytes, workers=m.workload.workers)
    bound = _bound(terms)
    ratio = terms[bound] / _loading_part(m.breakdown)
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
    b = m.breakdown
    seconds = b.transition_seconds + _loading_part(b) * (max(there.values()) / max(here.values()))
    floor = b.step_alone_seconds + b.transition_seconds
    bound = "compute" if seconds <= floor else _bound(there)
    return Prediction(cache_budget(cache_bytes), workers, max(floor, seconds), bound)


def _loading_part(b: Breakdown) -> float:
    """The part of the epoch a loader setting can move: all of it but its transitions (an evaluation, a
    checkpoint write take what they take)."""
    return max(b.epoch_seconds - b.transition_seconds, 1e-9)


def what_if(m: Measured) -> tuple[Prediction, ...]:
    """Cache sizes of 1/4 to 1 of the dataset at the measured workers, 1, 2, 4, 8 workers at the measured
    cache, and the measured point; deduplicated, sorted by (cache_bytes, workers)."""
    cache, workers = cache_budget(m.workload.cache_bytes), m.workload.workers
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


def form_what_if(m: Measured, cold: RunRecord) -> tuple[FormPrediction, ...]:
    """Our cache's records held raw, prepared or mixed, at the measured cache and workers (none where the
    cold run's loader weighed no forms). The loader weighed them itself, from the records it probed when it
    was made (``loader.form.choice``: its prep and the fetches of its misses, no step). A form changes those
    alone, so the measured epoch moves by the difference the loader weighed: ``max(T1, T2 - (weighed(held)
    - weighed(form)))``. What the weighing leaves out (collating and handing over the batches, starting
    workers, the step) costs the same in every form: scaling the epoch by the ratio of the two instead
    scaled those too (a prepared epoch predicted 0.30 s was measured 0.49-0.51 s; by the difference,
    0.43 s)."""
    weighed, held = cold.cache_form_epochs, cold.cache_form
    if held not in weighed:
        return ()
    b = m.breakdown
    return tuple(
        FormPrediction(
            form,
            max(b.step_alone_seconds + b.transition_seconds, b.epoch_seconds - (weighed[held] - seconds)),
            form == held,
        )
        for form, seconds in weighed.items()
    )
