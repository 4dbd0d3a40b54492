"""A batch sampler that hands a DataLoader one pack of example indices per step, resumable mid-epoch."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from loader.packing._packs import FlatPacks
from loader.packing.algorithms import KEEPS_ORDER, Algorithm, algorithm_named, check_lengths

__all__ = ["PackedBatchSampler"]


class PackedBatchSampler:
    """One pack per step: ``DataLoader(dataset, batch_sampler=sampler, collate_fn=PackingCollator(max_len))``.

    Every example is in exactly one pack per epoch. With ``shuffle`` each epoch draws, from ``(seed, epoch)``
    alone, a random order of the packs and which examples fill them: examples of equal length trade places
    (every algorithm but ``nextfit`` sees only lengths, so the packs stay as full as packed), and ``nextfit``
    packs a random order of the examples. An epoch is therefore known from its number, and the state is two
    numbers: ``state_dict()`` / ``load_state_dict()`` resume mid-epoch in a new process.

    Each pass over the sampler is the next epoch (``set_epoch`` pins one, as with ``DistributedSampler``).
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        max_len: int,
        *,
        algorithm: Algorithm = "ffd",
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self._packer = algorithm_named(algorithm)
        self.lengths = check_lengths(lengths, max_len)
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.max_len, self.algorithm, self.shuffle, self.seed = max_len, algorithm, shuffle, int(seed)
        self._epoch = 0
        self._position = 0  # packs of this epoch handed out
        self._begun = False  # this epoch's pass has started: the next pass is the next epoch
        self._resuming = False  # the next pass goes on from _position (after load_state_dict)
        self._drawn: tuple[int, FlatPacks] | None = None

    @property
    def epoch(self) -> int:
        """The epoch of the last pass begun, or of the next one where ``set_epoch`` pinned it."""
        return self._epoch

    def __len__(self) -> int:
        """Packs in the current epoch (the same in every epoch, except with ``nextfit`` and ``shuffle``)."""
        return len(self._packs())

    def __iter__(self) -> Iterator[list[int]]:
        # a generator: the pass begins at its first pack, as torch's samplers do (torch makes, and drops,
        # an iterator more than once per epoch with workers)
        if self._resuming:
            self._resuming = False
        else:
            self._epoch += 1 if self._begun else 0
            self._position = 0
        self._begun = True
        packs = self._packs()
        while self._position < len(packs):
            self._position += 1
            yield packs[self._position - 1]

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (the rest of it, when a state of that epoch was just loaded)."""
        if epoch != self._epoch or not self._resuming:
            self._resuming, self._position = False, 0
        self._epoch, self._begun = int(epoch), False

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where this epoch stands. ``consumed``: the packs of this epoch the training loop has used, where
        that is fewer than were handed out (torch's DataLoader with workers asks for packs ahead of use);
        by default, every pack handed out."""
        position = self._position
        if consumed is not None:
            if not 0 <= consumed <= position:
                raise ValueError(f"consumed must be in 0..{position} (packs handed out), got {consumed!r}")
            position = consumed
        return {"epoch": self._epoch, "position": position, **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass the rest of the saved epoch (the next epoch, if the saved one was finished)."""
        differ = {k: (state.get(k), mine) for k, mine in self._identity().items() if state.get(k) != mine}
        if differ:
            raise ValueError(f"the state is another sampler's; differs in (saved, this one): {differ}")
        self._epoch, self._position = int(state["epoch"]), int(state["position"])
        self._begun = self._position >= len(self._packs())
        self._resuming = not self._begun

    def _identity(self) -> dict[str, Any]:
        """What a saved state must agree on to mean the same packs here."""
        return {
            "algorithm": self.algorithm,
            "max_len": self.max_len,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "examples": len(self.lengths),
            "tokens": int(self.lengths.sum()),
        }

    def _packs(self) -> FlatPacks:
        if self._drawn is None or self._drawn[0] != self._epoch:
            self._drawn = (self._epoch, self._draw(self._epoch))
        return self._drawn[1]

    @functools.cached_property
    def _packed(self) -> FlatPacks:
        """The packs as the algorithm makes them from the examples in their own order."""
        return FlatPacks.of(self._packer(self.lengths, self.max_len))

    def _draw(self, epoch: int) -> FlatPacks:
        if not self.shuffle:
            return self._packed
        rng = np.random.default_rng([self.seed, epoch])
        if self.algorithm in KEEPS_ORDER:
            order = rng.permutation(len(self.lengths))
            return FlatPacks.of(self._packer(self.lengths[order], self.max_len)).relabelled(order)
        swapped = self._packed.relabelled(_same_length_swap(self.lengths, rng))
        return swapped.reordered(rng.permutation(len(swapped)))


def _same_length_swap(lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``new[i]``: an example of the same length as ``i``, drawn at random, each example drawn once."""
    in_order = np.argsort(lengths, kind="stable")
    drawn = np.lexsort((rng.random(len(lengths)), lengths))  # by length, ties in random order
    new = np.empty_like(in_order)
    new[in_order] = drawn
    return new
