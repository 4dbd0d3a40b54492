"""One digest for source fingerprints: sha256 over the reprs of plain values (ints, strings, tuples)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["digest"]


def digest(parts: Iterable[object]) -> str:
    """Hex sha256 of ``parts``, each written as its repr and a separator, so order and boundaries count."""
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()
