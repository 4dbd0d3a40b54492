"""One digest for source fingerprints: sha256 over the reprs of plain values (ints, strings, tuples)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["Digest", "digest"]


class Digest:
    """sha256 of parts added one at a time, each written as its repr and a separator, so order and
    boundaries count: a long listing is digested as it is read, never held whole."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, part: object) -> None:
        self._sha.update(repr(part).encode())
        self._sha.update(b"\0")

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def digest(parts: Iterable[object]) -> str:
    """Hex ``Digest`` of ``parts``."""
    d = Digest()
    for part in parts:
        d.add(part)
    return d.hexdigest()
