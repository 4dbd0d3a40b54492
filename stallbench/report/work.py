"""The useful-work rows of the terminal table (``stallbench.analysis.work``), and a report's column name.

Token rows appear only where some loader ran token batches; the energy rows always, each figure marked
``(CPU estimate)`` where it was estimated from CPU time rather than read from a counter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from stallbench._words import counted
from stallbench.analysis.results import LoaderReport
from stallbench.analysis.work import UsefulWork
from stallbench.energy import ESTIMATE

__all__ = ["column_name", "work_rows"]

Cell = Callable[[LoaderReport], str]
Ratio = Callable[[LoaderReport, LoaderReport], str]
Spec = tuple[tuple[str, Cell | None, Ratio | None], ...]


def column_name(r: LoaderReport) -> str:
    """The loader, with the packing its batches had: unique within a report (``"cached+ffd"``)."""
    packing = r.useful.packing if r.useful is not None else None
    return r.loader if packing is None else f"{r.loader}+{packing}"


def _cell(value: Callable[[UsefulWork], float | None], fmt: str) -> Cell:
    def cell(r: LoaderReport) -> str:
        x = value(r.useful) if r.useful is not None else None
        return format(x, fmt) if x is not None and math.isfinite(x) else "-"

    return cell


def _ratio(value: Callable[[UsefulWork], float | None]) -> Ratio:
    """Ours over the baseline's, as ``1.85x``."""

    def ratio(base: LoaderReport, r: LoaderReport) -> str:
        b = value(base.useful) if base.useful is not None else None
        o = value(r.useful) if r.useful is not None else None
        ok = b is not None and o is not None and math.isfinite(b) and math.isfinite(o) and b > 0
        return f"{o / b:.2f}x" if ok else "-"

    return ratio


def _energy(value: Callable[[UsefulWork], float | None], fmt: str) -> Cell:
    plain = _cell(value, fmt)

    def cell(r: LoaderReport) -> str:
        text = plain(r)
        estimated = r.useful is not None and r.useful.energy_source == ESTIMATE
        return f"{text} (CPU estimate)" if estimated and text != "-" else text

    return cell


def _padding(r: LoaderReport) -> str:
    x = r.useful.padding_fraction if r.useful is not None else None
    return f"{100 * x:.1f}%" if x is not None and math.isfinite(x) else "-"


_TOKENS: Spec = (
    ("valid tokens/s", _cell(lambda u: u.valid_tokens_per_s, ",.0f"), _ratio(lambda u: u.valid_tokens_per_s)),
    ("padded tokens/s", _cell(lambda u: u.token_slots_per_s, ",.0f"), None),
    ("  padding", _padding, None),
)
_STEPS: Spec = (
    ("unique examples", _cell(lambda u: u.unique_samples, ",.0f"), None),
    ("optimizer updates", _cell(lambda u: u.updates, ",.0f"), None),
    ("updates/s", _cell(lambda u: u.updates_per_s, ",.1f"), None),
)
_ENERGY: Spec = (("energy per epoch (J)", _energy(lambda u: u.energy_joules, ",.1f"), None),)
_ENERGY_PER_TOKEN: Spec = (("J per 1k valid tokens", _energy(lambda u: u.joules_per_1k_tokens, ".3g"), None),)
_ENERGY_PER_SAMPLE: Spec = (("J per sample", _energy(lambda u: u.joules_per_sample, ".3g"), None),)


def _target(r: LoaderReport) -> str:
    t = r.useful.time_to_target if r.useful is not None else None
    if t is None:
        return "-"
    when = f"{t.seconds:.1f} s, {counted(t.epochs, 'epoch')}, {counted(t.updates, 'update')}"
    return f"{when} ({t.value:g})" if t.reached else f"not reached ({t.value:g} after {when})"


def _target_ratio(base: LoaderReport, r: LoaderReport) -> str:
    """The baseline's time to target over ours, where both reached it: how much sooner ours got there."""
    b, o = (x.useful.time_to_target if x.useful is not None else None for x in (base, r))
    ok = b is not None and o is not None and b.reached and o.reached and o.seconds > 0
    return f"{b.seconds / o.seconds:.2f}x sooner" if ok else "-"


_TARGET: Spec = (("time to target", _target, _target_ratio),)


def work_rows(reports: Sequence[LoaderReport]) -> Spec:
    """The rows for these reports: a heading, token rows where there are token batches, steps, energy, and
    the time to a quality target where the command reported one."""
    if all(r.useful is None for r in reports):
        return ()
    target = _TARGET if any(r.useful is not None and r.useful.time_to_target for r in reports) else ()
    tokens = any(r.useful is not None and r.useful.valid_tokens is not None for r in reports)
    per_unit = _ENERGY_PER_TOKEN if tokens else _ENERGY_PER_SAMPLE
    heading: Spec = (("useful work (steady epoch)", None, None),)
    return heading + (_TOKENS if tokens else ()) + _STEPS + _ENERGY + per_unit + target
