"""How much padding packing removes: figures to judge an algorithm and a ``max_len`` by, before training."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loader.packing.algorithms import Algorithm, check_lengths, pack

__all__ = ["PackingReport", "packing_report"]


@dataclass(frozen=True)
class PackingReport:
    """Token slots and what fills them, padded (each example padded to ``max_len``) and packed."""

    algorithm: str
    max_len: int
    examples: int
    tokens: int
    packs: int

    @property
    def padded_fraction(self) -> float:
        """Padding in batches of examples each padded to ``max_len`` (the fixed-shape way)."""
        return 1 - self.tokens / (self.examples * self.max_len) if self.examples else 0.0

    @property
    def efficiency(self) -> float:
        """Tokens over the packs' slots, ``tokens / (packs * max_len)``: 1.0 is no padding at all."""
        return self.tokens / (self.packs * self.max_len) if self.packs else 1.0

    @property
    def packed_fraction(self) -> float:
        """Padding left in the packs, each filled to ``max_len``."""
        return 1 - self.efficiency

    @property
    def fewest_packs(self) -> int:
        """A bound no algorithm beats: the tokens over ``max_len``, rounded up."""
        return -(-self.tokens // self.max_len)


def packing_report(
    lengths: Sequence[int] | np.ndarray, max_len: int, algorithm: Algorithm = "ffd"
) -> PackingReport:
    """Pack ``lengths`` with ``algorithm`` and count: padding before and after, and the packing efficiency."""
    sizes = check_lengths(lengths, max_len)
    packs = pack(sizes, max_len, algorithm)
    return PackingReport(algorithm, max_len, len(sizes), int(sizes.sum()), len(packs))
