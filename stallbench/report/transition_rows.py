"""The rows of the epoch's transitions (``stallbench.jobs._transitions``): evaluations, checkpoint writes and
compilations, each kind with its seconds and count; inside the steady epoch (a part of it), between epochs
and in the first epoch beyond a steady one's (apart, as the warm-up is)."""

from __future__ import annotations

from collections.abc import Sequence

from stallbench.analysis.results import LoaderReport
from stallbench.report._cells import Cell, Ratio, Spec, sec

__all__ = ["transition_rows", "warmup_rows"]


_TRANSITION_NAMES = {
    "evaluation": "evaluation",
    "checkpoint": "checkpoint writes",
    "compilation": "compilation",
}


def _transition(kind: str, between: bool) -> Cell:
    """A kind of transition: seconds per epoch (inside it: and % of it) and how many."""

    def cell(r: LoaderReport) -> str:
        made = r.breakdown.transitions_between if between else r.breakdown.transitions
        seconds, count = made.get(kind, (0.0, 0.0))
        share = "" if between else f" ({r.breakdown.percent(seconds):.1f}%)"
        return f"{sec(seconds)}{share}, {count:g} per epoch"

    return cell


def transition_rows(reports: Sequence[LoaderReport]) -> Spec:
    """A row per kind of transition any report made: inside the epoch (a part of it), and between epochs
    (apart, as the warm-up)."""
    rows: list[tuple[str, Cell | None, Ratio | None]] = []
    for between, where in ((False, ""), (True, " between epochs (apart)")):
        found = {
            k
            for r in reports
            for k in (r.breakdown.transitions_between if between else r.breakdown.transitions)
        }
        for kind in sorted(found, key=lambda k: (k not in _TRANSITION_NAMES, k)):
            rows.append((f"{_TRANSITION_NAMES.get(kind, kind)}{where}", _transition(kind, between), None))
    return tuple(rows)


def warmup_rows(reports: Sequence[LoaderReport]) -> Spec:
    """Under the warm-up: what the first epoch made beyond a steady one's (``torch.compile``'s first
    compilations), each kind with its seconds and count."""
    found = {k for r in reports for k in r.breakdown.warmup_transitions}

    def cell(kind: str) -> Cell:
        def text(r: LoaderReport) -> str:
            seconds, count = r.breakdown.warmup_transitions.get(kind, (0.0, 0.0))
            return f"{sec(seconds)}, {count:g}"

        return text

    kinds = sorted(found, key=lambda k: (k not in _TRANSITION_NAMES, k))
    return tuple((f"  of which {_TRANSITION_NAMES.get(k, k)}", cell(k), None) for k in kinds)
