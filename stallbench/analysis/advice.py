"""One line of advice from an analysis: the stall that bounds the epoch and the setting that cuts it, with the
what-if's numbers (``stallbench.analysis.whatif``); and that setting as a run makes it (:class:`Advised`).

Where prep binds and our cache weighed the forms of its records, a form it did not hold but predicts at least
10% faster (the loader's own margin for leaving raw bytes) is advised as ``cache_form=``, when it beats the
best worker count."""

from __future__ import annotations

from dataclasses import dataclass

from stallbench.analysis.arguments import FORM_ARGUMENT, cache_arguments, form_argument
from stallbench.analysis.hits import cache_budget
from stallbench.analysis.results import Advised, FormPrediction, Prediction
from stallbench.analysis.slow_samples import slow_samples_said
from stallbench.analysis.whatif import Measured, predict, roofline
from stallbench.conditions.sizes import format_bytes
from stallbench.jobs.kinds import CACHED, KINDS

__all__ = ["advise", "advised"]

ACT_ON = 10.0  # a stall under this % of the epoch is not worth acting on
MIN_GAIN = 0.02  # an action must cut the epoch by at least this fraction to be advised
FORM_GAIN = 0.10  # a form of record must cut the weighed epoch by this much (the loader's own margin)


def _gain(prediction: Prediction | FormPrediction, m: Measured) -> str:
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


def _prep_action(m: Measured, predictions: tuple[Prediction, ...]) -> Prediction | None:
    """The fewest workers that give the fastest epoch, if that is worth it."""
    worth = (1.0 - MIN_GAIN) * m.breakdown.epoch_seconds
    options = [p for p in predictions if p.workers != m.workload.workers and p.epoch_seconds < worth]
    return min(options, key=lambda p: (p.epoch_seconds, p.workers), default=None)


def _form_action(forms: tuple[FormPrediction, ...], workers: Prediction | None) -> FormPrediction | None:
    """The form of record predicted fastest, where it is not the one held, cuts the epoch by ``FORM_GAIN``
    and beats the ``workers`` option."""
    held = next((f for f in forms if f.as_run), None)
    best = min(forms, key=lambda f: f.epoch_seconds, default=None)
    if held is None or best is None or best.as_run:
        return None
    if best.epoch_seconds >= (1.0 - FORM_GAIN) * held.epoch_seconds:
        return None
    return best if workers is None or best.epoch_seconds < workers.epoch_seconds else None


def _dominant(m: Measured, prep: float, fetch: float) -> str:
    """The stall to act on: the one the roofline says bounds the epoch, if it was measured worth acting on;
    else the larger one measured.

    Removing a stall that is not the bound does not shorten the epoch: with fetch the bound, a faster
    decode only moves the wait from prep to fetch.
    """
    measured = {"fetch": fetch, "prep": prep}  # a tie goes to fetch
    bound = roofline(m).bound
    return bound if measured.get(bound, 0.0) >= ACT_ON else max(measured, key=measured.__getitem__)


@dataclass(frozen=True)
class _Choice:
    """What an analysis acts on: ``stall`` ("fetch", "prep" or "none" worth acting on, by its percentages)
    and the setting chosen for it, if any: a form of record, a worker count or a fetch action."""

    stall: str
    prep: float
    fetch: float
    form: FormPrediction | None = None
    workers: Prediction | None = None
    fetch_action: tuple[Prediction, str, str] | None = None


def _choose(m: Measured, predictions: tuple[Prediction, ...], forms: tuple[FormPrediction, ...]) -> _Choice:
    """The one decision :func:`advise` words and :func:`advised` runs."""
    b = m.breakdown
    prep, fetch = b.percent(b.prep_stall_seconds), b.percent(b.fetch_stall_seconds)
    if max(prep, fetch) < ACT_ON:
        return _Choice("none", prep, fetch, form=_form_action(forms, None) if _cores_bind(m) else None)
    if _dominant(m, prep, fetch) == "fetch":
        return _Choice("fetch", prep, fetch, fetch_action=_fetch_action(m, predictions))
    best = _prep_action(m, predictions)
    return _Choice("prep", prep, fetch, form=_form_action(forms, best), workers=best)


def advised(
    m: Measured, predictions: tuple[Prediction, ...], forms: tuple[FormPrediction, ...] = ()
) -> Advised | None:
    """The setting :func:`advise` names; None where it names none (no stall worth acting on, or no setting
    predicted faster)."""
    c = _choose(m, predictions, forms)
    if c.form is not None:
        form = FORM_ARGUMENT[c.form.form]
        return Advised(m.loader, m.workload.workers, m.workload.cache_bytes, c.form.epoch_seconds, form)
    if c.workers is not None:
        return Advised(m.loader, c.workers.workers, c.workers.cache_bytes, c.workers.epoch_seconds)
    if c.fetch_action is not None:
        p, _, loader = c.fetch_action
        return Advised(loader, p.workers, p.cache_bytes, p.epoch_seconds)
    return None


def _cores_bind(m: Measured) -> bool:
    """No stall to act on, yet the roofline's bound is prep: the step shares the cores with it."""
    return roofline(m).bound == "prep"


def _no_stall(m: Measured, stalls: float, form: FormPrediction | None) -> str:
    """No stall to act on; where the roofline's bound is not the step alone, what it is instead: the step
    sharing the cores with prep (its contention: a form of record that saves prep would help), or storage
    that a faster step would meet."""
    bound = roofline(m).bound
    if bound == "compute":
        return f"no stall worth acting on: the epoch is compute-bound (stalls {stalls:.0f}%)"
    head = f"no stall worth acting on (stalls {stalls:.0f}%)"
    if bound == "prep":
        b = m.breakdown
        slower = b.contention_seconds / b.step_alone_seconds if b.step_alone_seconds > 0 else 0.0
        head += f", but the cores bound the epoch: the step shares {m.machine.cores} cores with prep "
        head += f"and ran {slower:.0%} slower than alone"
        if form is not None:
            return f"{head}; {form_argument(form)} would bring the epoch to {_gain(form, m)}"
        return f"{head}; a faster decode or more cores would help"
    return f"{head}, but storage bounds the epoch: a faster step would wait for it"


def advise(m: Measured, predictions: tuple[Prediction, ...], forms: tuple[FormPrediction, ...] = ()) -> str:
    """One line: the stall that bounds the epoch and the action that cuts it, with numbers; ``forms``: the
    what-if of our cache's forms of record, where it weighed them. Where a few slow batches make most of a
    stall worth acting on, it says so and names the setting that keeps slow samples from holding batches."""
    c = _choose(m, predictions, forms)
    return _stall_advice(m, c) + ("" if c.stall == "none" else slow_samples_said(m))


def _stall_advice(m: Measured, c: _Choice) -> str:
    prep, fetch = c.prep, c.fetch
    if c.stall == "none":
        return _no_stall(m, prep + fetch, c.form)
    if c.stall == "fetch":
        head = f"fetch stall is {fetch:.0f}% of the epoch"
        head += "" if fetch >= prep else f" and storage bounds it (prep stall {prep:.0f}% waits behind it)"
        if c.fetch_action is None:
            storage = format_bytes(m.machine.storage_bytes_per_s)
            return f"{head}: no larger cache predicts a faster epoch; storage reads {storage}/s"
        return f"{head}: {c.fetch_action[1]} would cut the epoch to {_gain(c.fetch_action[0], m)}"
    head = f"prep stall is {prep:.0f}% of the epoch"
    head += "" if prep >= fetch else f" and decode bounds it (fetch stall {fetch:.0f}% waits behind it)"
    rate = f"decode is {m.machine.prep_samples_per_s_per_core:.0f} samples/s per core"
    if c.form is not None:
        return f"{head}: {form_argument(c.form)} would bring the epoch to {_gain(c.form, m)}; {rate}"
    if c.workers is None:
        where = f"{m.workload.workers} workers on {m.machine.cores} cores"
        return f"{head} with {where}: {rate}; more workers would not help, faster decode or more cores would"
    return f"{head}: {c.workers.workers} workers would bring the epoch to {_gain(c.workers, m)}; {rate}"
