"""Packs held as two flat arrays, so that an epoch's packs can be redrawn with a few numpy operations."""

from __future__ import annotations

import numpy as np

__all__ = ["FlatPacks"]


class FlatPacks:
    """Pack ``k`` is ``members[bounds[k]:bounds[k + 1]]``: example indices, in the order they are packed."""

    def __init__(self, members: np.ndarray, bounds: np.ndarray) -> None:
        self.members, self.bounds = members, bounds

    @classmethod
    def of(cls, packs: list[list[int]]) -> FlatPacks:
        sizes = np.fromiter((len(p) for p in packs), dtype=np.int64, count=len(packs))
        members = np.fromiter((i for p in packs for i in p), dtype=np.int64, count=int(sizes.sum()))
        return cls(members, np.concatenate([[0], np.cumsum(sizes)]))

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, k: int) -> list[int]:
        return self.members[self.bounds[k] : self.bounds[k + 1]].tolist()

    def relabelled(self, new_index: np.ndarray) -> FlatPacks:
        """The same packs with example ``i`` replaced by ``new_index[i]``."""
        return FlatPacks(new_index[self.members], self.bounds)

    def reordered(self, order: np.ndarray) -> FlatPacks:
        """The packs taken in ``order`` (pack ``order[0]`` first)."""
        sizes = np.diff(self.bounds)[order]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        shift = np.repeat(self.bounds[:-1][order] - bounds[:-1], sizes)
        return FlatPacks(self.members[np.arange(len(self.members)) + shift], bounds)
