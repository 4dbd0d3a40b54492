"""How a count reads in stallbench's text: "1 batch", "2 batches", "0 epochs"."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: float, unit: str, units: str | None = None) -> str:
    """``n``, rounded, and its unit (``units``: the plural where adding "s" does not make it)."""
    shown = f"{n:,.0f}"
    return f"{shown} {unit if shown == '1' else units or unit + 's'}"
