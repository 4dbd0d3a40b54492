"""Mid-epoch resume: the random states an epoch's order was drawn from and the batches handed out are kept, so
a restored loader draws that order again and yields exactly what remained.

The position is kept, not the order: a sampler may be endless, or list millions of indices, and listing it
before the first batch cost 1 GB and a second on 20M indices (torch's loader yields at once). Drawing again
is exact for a sampler that draws from the loader's generator, its own ``generator`` or torch's global random
state, as all of torch's samplers do; what was handed out is skipped, as torchdata's StatefulDataLoader
fast-forwards a sampler. A sampler with a ``state_dict()`` of its own (``PackedBatchSampler``, a seeded
endless batch sampler), given as ``batch_sampler=`` or as ``sampler=``, is kept as that state at the epoch's
start: the user restores it mid-epoch, ahead of use (torch's loader asks for batches ahead), so a resumed
epoch loads the start state back before it skips what was handed out. Its order is never listed: it may
never end.
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["ReplayableSampler", "generator_states", "restore_generators"]

GLOBAL = "torch"  # the name of torch's global random state among the states kept
OWN = "sampler_states"  # and of the own states, at the epoch's start, of samplers that have a state_dict()
LISTED = "order"  # a state saved before version 4 kept such a sampler's whole order instead


def _stateful(sampler: Any) -> bool:
    return all(callable(getattr(sampler, name, None)) for name in ("state_dict", "load_state_dict"))


def stateful_parts(index_sampler: Any) -> dict[str, Any]:
    """The samplers behind a loader's index sampler that keep a ``state_dict()`` of their own, by role: the
    batch sampler, and the sampler torch's ``BatchSampler`` draws from."""
    parts = {"batch_sampler": index_sampler, "sampler": getattr(index_sampler, "sampler", None)}
    if not isinstance(index_sampler, torch.utils.data.BatchSampler):
        del parts["sampler"]
    return {role: part for role, part in parts.items() if _stateful(part)}


class ReplayableSampler:
    """Wraps the loader's index sampler; draws an epoch's order lazily, exactly as the wrapped one would,
    keeping the random states (``generators()``'s and torch's global one) the draw started from."""

    def __init__(self, inner: Any, generators: Callable[[], dict[str, torch.Generator | None]]) -> None:
        """``generators``: the loader's own method; held weakly, so that the loader (which holds this
        sampler) is freed as soon as its last reference goes, and its persistent workers stop then; an
        iterator that outlives its loader (``next(iter(DataLoader(...)))``) draws from the generators the
        loader had last."""
        self.inner = inner
        self._loader_generators = weakref.WeakMethod(generators)
        self._last_generators = generators()
        self.draw_states: dict[str, Any] = {}  # what the current epoch's draw started from
        self.epochs_started = 0  # how many times an epoch's order was drawn or resumed
        self.unsaved: str | None = None  # why the current epoch's start could not be kept, if it could not
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None
        self._before_draw: Any = None

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        # a generator: nothing is drawn until the first index is asked for, as with torch's own samplers
        if self._pending is None:
            if self._before_draw is not None:
                self._before_draw, before = None, self._before_draw
                before()
            self.draw_states = {**generator_states(self._generators()), GLOBAL: torch.get_rng_state()}
            self.draw_states[OWN], self.unsaved = self._own_states()
            self.epochs_started += 1
            yield from self.inner
            return
        (self.draw_states, start), self._pending = self._pending, None
        self.epochs_started += 1
        if LISTED in self.draw_states:
            yield from self.draw_states[LISTED][start:]
            return
        yield from self._redrawn(start)

    def _own_states(self) -> tuple[dict[str, Any], str | None]:
        """(the own states of the samplers that keep one, copied; why they could not be had, or None). A
        sampler whose ``state_dict()`` fails costs the loader its ``state_dict()``, never the epoch."""
        try:
            return {
                role: copy.deepcopy(part.state_dict()) for role, part in stateful_parts(self.inner).items()
            }, None
        except Exception as exc:  # the user's code: any failure
            return {}, f"{type(exc).__name__}: {exc}"

    def _redrawn(self, start: int) -> Iterator[Any]:
        """The saved epoch drawn again from its states, from position ``start`` on; torch's global random
        state is the process's own again once the handed-out part is skipped."""
        own = torch.get_rng_state()
        restore_generators(self._generators(), self.draw_states)
        torch.set_rng_state(self.draw_states[GLOBAL])
        parts = stateful_parts(self.inner)
        for role, state in self.draw_states.get(OWN, {}).items():
            parts[role].load_state_dict(copy.deepcopy(state))
        order = iter(self.inner)
        try:
            first = next(itertools.islice(order, start, None))
        except StopIteration:
            return
        finally:
            torch.set_rng_state(own)
        yield first
        yield from order

    def _generators(self) -> dict[str, torch.Generator | None]:
        method = self._loader_generators()
        if method is not None:
            self._last_generators = method()
        return self._last_generators

    def resume(self, draw_states: dict[str, Any], position: int) -> None:
        """Make the next epoch the one drawn from ``draw_states``, from ``position`` on. Raises ValueError
        where they hold the own state of a sampler this loader does not have."""
        missing = set(draw_states.get(OWN, {})) - set(stateful_parts(self.inner))
        if missing:
            raise ValueError(
                f"the state holds the own state_dict() of the saved loader's {', '.join(sorted(missing))}, "
                "which this loader does not have (or has without state_dict/load_state_dict)"
            )
        self._pending = (draw_states, position)

    def before_next_draw(self, callback: Any) -> None:
        """Call ``callback()`` once, just before the next epoch's order is drawn from the inner sampler."""
        self._before_draw = callback

    def next_start(self) -> int:
        """Position at which the next epoch begins: 0, or where a resumed epoch left off."""
        return 0 if self._pending is None else self._pending[1]


def generator_states(generators: dict[str, torch.Generator | None]) -> dict[str, torch.Tensor]:
    return {name: g.get_state() for name, g in generators.items() if g is not None}


def restore_generators(generators: dict[str, torch.Generator | None], states: dict[str, Any]) -> None:
    for name, state in states.items():
        generator = generators.get(name) if name not in (GLOBAL, OWN, LISTED) else None
        if generator is not None:
            generator.set_state(state)
