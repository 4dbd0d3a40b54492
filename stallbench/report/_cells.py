"""How a value reads in the report's table: seconds, percentages (bytes: ``stallbench.conditions.sizes``);
a row's spec."""

from __future__ import annotations

import math
from collections.abc import Callable

from stallbench.analysis.results import LoaderReport

__all__ = ["Cell", "Ratio", "Spec", "finite", "pct", "sec"]

Cell = Callable[[LoaderReport], str]
Ratio = Callable[[LoaderReport, LoaderReport], str]
# label, cell, ratio against the baseline (None: no ratio); a row without a cell is a section heading
Spec = tuple[tuple[str, Cell | None, Ratio | None], ...]


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def sec(x: float) -> str:
    return f"{x:.2f} s" if finite(x) else "-"


def pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%" if finite(fraction) else "-"
