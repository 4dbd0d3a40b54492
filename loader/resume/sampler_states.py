"""The own ``state_dict()`` of a sampler behind a loader, watched over an epoch, so that a resumed epoch is
exact for either kind of sampler state users write, with memory that does not grow with the epoch.

A sampler's state either *moves* as it draws (torchdata's ``StatefulDistributedSampler``, our
``PackedBatchSampler``: the state is the position, and loading it makes the next pass go on from there), or
it does not (a seeded sampler whose state says which pass comes next, ``{"seed": 3}``: loading it makes the
next pass start again). The kind is told from the states after the epoch's first two draws (one drawn ahead,
as torch's workers draw ahead anyway). A moving state is saved as it is when the loader's ``state_dict()`` is
asked, with the batches drawn ahead of use (at most the prefetch); a still one as it was when the epoch began,
with the position, and the epoch is drawn again and skipped to it, as for torch's samplers.
Written by hand: torchdata's StatefulDataLoader trusts a sampler's state as its position, which restarts a
sampler of the second kind.
"""

from __future__ import annotations

import collections
import copy
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["OwnStates", "load", "stateful_parts"]

_CLASSIFYING_DRAWS = 2  # the states after this many draws tell whether the state moves


def stateful_parts(index_sampler: Any) -> dict[str, Any]:
    """The samplers behind a loader's index sampler that keep a ``state_dict()`` of their own, by role: the
    batch sampler, and the sampler torch's ``BatchSampler`` draws from."""
    parts = {"batch_sampler": index_sampler}
    if isinstance(index_sampler, torch.utils.data.BatchSampler):
        parts["sampler"] = index_sampler.sampler
    return {role: part for role, part in parts.items() if _stateful(part)}


def _stateful(sampler: Any) -> bool:
    return all(callable(getattr(sampler, name, None)) for name in ("state_dict", "load_state_dict"))


class OwnStates:
    """One epoch of the stateful ``parts`` (``stateful_parts``): its start state, whether the state moves, and
    the items drawn and not yet handed out. A ``state_dict()`` that fails makes ``unsaved`` say why; the
    epoch runs on."""

    def __init__(self, parts: dict[str, Any], first: int = 0, moving: bool | None = None) -> None:
        """``first``: the position of the epoch's first item drawn (a resumed epoch's: where it goes on);
        ``moving``: whether the state moves, where known (a resumed epoch's)."""
        self.parts = parts
        self.unsaved: str | None = None
        self.start = self._now()
        self._moving = moving
        self._after: list[dict[str, Any] | None] = []  # the states after the first draws
        # (position, item) of the items drawn and not handed out
        self._ahead: collections.deque[tuple[int, Any]] = collections.deque()
        self._taken = first

    def watch(self, order: Iterable[Any]) -> Iterator[Any]:
        """``order``'s items; the first two are drawn at once, for the states after them."""
        noted = self._noted(iter(order))
        if self._moving is None:
            yield from list(itertools.islice(noted, _CLASSIFYING_DRAWS))
        yield from noted

    def handed_out(self, count: int) -> None:
        """The epoch's first ``count`` items were handed out: they are no longer kept."""
        while self._ahead and self._ahead[0][0] < count:
            self._ahead.popleft()

    def saved(self) -> dict[str, Any] | None:
        """What resumes this epoch where it stands (``ReplayableSampler._redrawn``): a still state's start,
        or a moving state now with the items drawn ahead; None where a ``state_dict()`` failed
        (``unsaved``)."""
        if self.unsaved is not None:
            return None
        if not self.moves():
            return {"start": self.start}
        now = self._now()
        return None if now is None else {"now": now, "ahead": [item for _, item in self._ahead]}

    def moves(self) -> bool:
        """Whether the state moves as the sampler draws: the states after the first two draws differ (after
        one draw, the state before it and after it)."""
        if self._moving is not None:
            return self._moving
        states = [self.start, *self._after][-_CLASSIFYING_DRAWS:]
        return len(states) == _CLASSIFYING_DRAWS and not _same(*states)

    def _noted(self, order: Iterator[Any]) -> Iterator[Any]:
        for item in order:
            self._ahead.append((self._taken, item))
            self._taken += 1
            if self._moving is None and len(self._after) < _CLASSIFYING_DRAWS:
                self._after.append(self._now())
            yield item

    def _now(self) -> dict[str, Any] | None:
        try:
            return {role: copy.deepcopy(part.state_dict()) for role, part in self.parts.items()}
        except Exception as exc:  # the user's code, any failure: it costs the loader's state_dict only
            self.unsaved = self.unsaved or f"{type(exc).__name__}: {exc}"
            return None


def load(parts: dict[str, Any], states: dict[str, Any]) -> None:
    """Load each part's saved state (a copy: the saved one may be loaded again)."""
    for role, state in states.items():
        parts[role].load_state_dict(copy.deepcopy(state))


def _same(a: Any, b: Any) -> bool:
    """Whether two states are equal value for value (tensors and arrays compared whole)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)
