"""The rows of the epoch's transitions (``stallbench.jobs._transitions``): evaluations, checkpoint writes and
compilations, each kind with its seconds and count; inside the steady epoch (a part of it), between epochs
and in the first epoch beyond a steady one's (apart, as the warm-up is)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from stallbench.analysis.results import Breakdown, LoaderReport
from stallbench.report._cells import Cell, Spec, sec

__all__ = ["transition_rows", "warmup_rows"]


_TRANSITION_NAMES = {
    "evaluation": "evaluation",
    "checkpoint": "checkpoint writes",
    "compilation": "compilation",
    "phase": "phases marked (stallbench.profile)",
}
Made = Callable[[Breakdown], Mapping[str, tuple[float, float]]]  # per kind: seconds, count
Said = Callable[[Breakdown, float, float], str]  # a cell's text from the seconds and count


def transition_rows(reports: Sequence[LoaderReport]) -> Spec:
    """A row per kind of transition any report made: inside the epoch (a part of it), and between epochs
    (apart, as the warm-up)."""
    inside = _rows(reports, lambda b: b.transitions, "{}", _per_epoch_share)
    between = _rows(reports, lambda b: b.transitions_between, "{} between epochs (apart)", _per_epoch)
    return inside + between


def warmup_rows(reports: Sequence[LoaderReport]) -> Spec:
    """Under the warm-up: what the first epoch made beyond a steady one's (``torch.compile``'s first
    compilations), each kind with its seconds and count."""
    return _rows(reports, lambda b: b.warmup_transitions, "  of which {}", lambda b, s, n: f"{sec(s)}, {n:g}")


def _rows(reports: Sequence[LoaderReport], made: Made, label: str, said: Said) -> Spec:
    """A row per kind any report's ``made`` holds, the known kinds first, each labelled ``label``."""
    found = {kind for r in reports for kind in made(r.breakdown)}
    kinds = sorted(found, key=lambda k: (k not in _TRANSITION_NAMES, k))
    return tuple((label.format(_TRANSITION_NAMES.get(k, k)), _cell(made, k, said), None) for k in kinds)


def _cell(made: Made, kind: str, said: Said) -> Cell:
    def cell(r: LoaderReport) -> str:
        return said(r.breakdown, *made(r.breakdown).get(kind, (0.0, 0.0)))

    return cell


def _per_epoch(b: Breakdown, seconds: float, count: float) -> str:
    return f"{sec(seconds)}, {count:g} per epoch"


def _per_epoch_share(b: Breakdown, seconds: float, count: float) -> str:
    return f"{sec(seconds)} ({b.percent(seconds):.1f}%), {count:g} per epoch"
