"""Sizes as people write and read them, the one place stallbench turns bytes into text and back.

``parse_size`` reads ``K``/``M``/``G``/``T``/``P`` and ``Ki``/``KiB``... as powers of 1024, and
``KB``/``MB``... as powers of 1000 (so ``"1G"`` is 2**30 bytes and ``"1GB"`` is 10**9), case-insensitively.
``format_bytes`` writes decimal units, as the reports and DESIGN.md give record sizes: ``112000`` ->
``"112.00 kB"``; it is ``humanize.naturalsize``, as ``loader``'s messages use it (in binary units there).
No library reads sizes both ways (``"1G"`` in binary, ``"1GB"`` in decimal, as ``--cache`` and
``--memory-limit`` take them), so ``parse_size`` is written here.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

import humanize

__all__ = ["format_bytes", "parse_size"]

_UNITS = {"": 1, "b": 1} | {
    f"{prefix}{suffix}": (1000 if suffix == "b" else 1024) ** power
    for power, prefix in enumerate("kmgtp", start=1)
    for suffix in ("", "i", "ib", "b")
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: ``"1.5G"`` -> 1610612736, ``"112KB"`` -> 112000, ``"4096"`` -> 4096."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must not be negative, got {text!r}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size must be a string like '1.5G' or an int, got {text!r}")
    match = _SIZE.fullmatch(text.lower())
    if match is None or match[2] not in _UNITS:
        why = (
            "must not be negative"
            if text.strip().startswith("-")
            else "is not a size like '512M' or '1.5GiB'"
        )
        raise ValueError(f"{text!r} {why}")
    return round(Decimal(match[1]) * _UNITS[match[2]])


def format_bytes(count: float) -> str:
    """Decimal units: ``1_234_000_000`` -> ``"1.23 GB"``; ``"-"`` for a count that is not finite."""
    if not (isinstance(count, (int, float)) and math.isfinite(count)):
        return "-"
    return humanize.naturalsize(count, format="%.2f")
