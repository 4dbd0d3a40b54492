"""One digest for source fingerprints: sha256 over the reprs of plain values (ints, strings, tuples)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["digest"]


def digest(parts: Iterable[object]) -> str:
    """sha256 of ``parts``, each written as its repr and a separator, so order and boundaries count."""
    sha = hashlib.sha256()
    for part in parts:
        sha.update(repr(part).encode())
        sha.update(b"\0")
    return sha.hexdigest()
