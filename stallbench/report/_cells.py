"""How a value reads in the report's table: bytes, seconds, percentages; a row's spec."""

from __future__ import annotations

import math
from collections.abc import Callable

from stallbench.analysis.results import LoaderReport

__all__ = ["Cell", "Ratio", "Spec", "bytes_text", "finite", "pct", "sec"]

Cell = Callable[[LoaderReport], str]
Ratio = Callable[[LoaderReport, LoaderReport], str]
# label, cell, ratio against the baseline (None: no ratio); a row without a cell is a section heading
Spec = tuple[tuple[str, Cell | None, Ratio | None], ...]


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def bytes_text(count: float) -> str:
    """Decimal units: 1_234_000_000 -> '1.23 GB'."""
    if not finite(count):
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000:
            return f"{count:.0f} B" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    return f"{count:.2f} PB"


def sec(x: float) -> str:
    return f"{x:.2f} s" if finite(x) else "-"


def pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%" if finite(fraction) else "-"
