"""A resumable loader's side of its iterators: each batch handed to the training loop is counted (for
``state_dict``), and the random states its worker stamped on it are kept (``loader.resume.worker_random``)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

from loader.resume.worker_random import RandomStates, Stamped

__all__ = ["Tracked", "Tracking"]


class Tracked(Protocol):
    """A resumable loader, as its iterators tell it of each batch handed out."""

    def _count_delivered(self) -> None: ...

    def _keep_states(self, worker: int, states: RandomStates) -> None: ...


@dataclass(frozen=True)
class Tracking:
    """A resumable loader's side of its iterator: ``loader`` (held weakly, so that it is freed while an
    iterator outlives it) is told of each batch handed out and of the random states stamped on it. New
    workers start from ``restore`` (states by worker id) and ``seed`` (a base seed, instead of the one drawn;
    None: the drawn one), and the first epoch's first batch goes to worker ``turn``: a resumed epoch's
    workers start as the saved ones were, and are dealt the batches the saved ones would have been."""

    loader: weakref.ReferenceType[Tracked]
    restore: dict[int, RandomStates] = field(default_factory=dict)
    turn: int = 0
    seed: int | None = None

    def handed(self, batch: Any) -> Any:
        """``batch`` as the training loop gets it: counted, its stamp kept and taken off."""
        loader = self.loader()
        if loader is not None:
            loader._count_delivered()
        return self.unstamped(batch)

    def unstamped(self, made: Any) -> Any:
        """What a worker made (a batch, or a piece of one: ``ready_first``), its stamp kept and taken off."""
        if not isinstance(made, Stamped):
            return made
        loader = self.loader()
        if loader is not None:
            loader._keep_states(made.worker, made.states)
        return made.batch
