"""Mid-epoch resume: the random states an epoch's order was drawn from and the batches handed out are kept, so
a restored loader draws that order again and yields exactly what remained.

The position is kept, not the order: a sampler may be endless, or list millions of indices, and listing it
before the first batch cost 1 GB and a second on 20M indices (torch's loader yields at once). Drawing again
is exact for a sampler that draws from the loader's generator, its own ``generator`` or torch's global random
state, as all of torch's samplers do; what was handed out is skipped, as torchdata's StatefulDataLoader
fast-forwards a sampler. A sampler with a ``state_dict()`` of its own (``PackedBatchSampler``, a seeded
endless batch sampler), given as ``batch_sampler=`` or as ``sampler=``, is kept as that state, by its kind
(``loader/resume/sampler_states.py``), never as its order: it may never end.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DistributedSampler

from loader.resume.sampler_states import OwnStates, load, stateful_parts
from loader.resume.world_change import (
    Orders,
    dealing,
    dealt_again,
    needs_dealing_again,
    order_of,
    resumed_orders,
)

__all__ = ["ReplayableSampler", "generator_states", "restore_generators"]

GLOBAL = "torch"  # the name of torch's global random state among the states kept
OWN = "sampler_states"  # and of what resumes samplers that keep a state_dict() of their own (OwnStates.saved)
LISTED = "order"  # a state saved before version 4 kept such a sampler's whole order instead
WORLD = "distributed"  # how a DistributedSampler's epoch is dealt among ranks (``_world_change.Dealt``)


class ReplayableSampler:
    """Wraps the loader's index sampler; draws an epoch's order lazily, exactly as the wrapped one would,
    keeping the random states (``generators()``'s and torch's global one) the draw started from, and the
    samplers' own states (``OwnStates``) where they keep one."""

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
        self._own: OwnStates | None = None  # the current epoch's own sampler states, where kept
        self._pending: tuple[dict[str, Any], int] | None = None
        self._before_draw: Any = None
        self._length: int | None = None  # the current epoch's items, where dealt again among other ranks

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        # a generator: nothing is drawn until the first index is asked for, as with torch's own samplers
        if self._pending is None:
            if self._before_draw is not None:
                self._before_draw, before = None, self._before_draw
                before()
            self.draw_states = {**generator_states(self._generators()), GLOBAL: torch.get_rng_state()}
            self._length = None
            dealt = dealing(self.inner)
            if dealt is not None:
                self.draw_states[WORLD] = dealt
            parts = stateful_parts(self.inner)
            self._own = OwnStates(parts) if parts else None
            self.epochs_started += 1
            yield from self.inner if self._own is None else self._own.watch(iter(self.inner))
            return
        (self.draw_states, start), self._pending = self._pending, None
        self.epochs_started += 1
        self._length = None
        if LISTED in self.draw_states:
            yield from self.draw_states[LISTED][start:]
            return
        if needs_dealing_again(self.inner, self.draw_states.get(WORLD)):
            rest, dealt, self._length = dealt_again(self.inner, self.draw_states[WORLD], start)
            self.draw_states = {**self.draw_states, WORLD: dealt}
            yield from rest
            return
        yield from self._redrawn(start)

    def epoch_length(self) -> int:
        """Items in the current epoch: the inner sampler's, or, for an epoch dealt again among other ranks
        (``loader.resume.world_change``), those handed out before and this rank's part of the rest. Raises
        TypeError for an endless sampler."""
        return len(self.inner) if self._length is None else self._length

    def saved_draw(self) -> dict[str, Any]:
        """What the current epoch's draw is drawn again from (``resume``). Raises ValueError where a
        sampler's own ``state_dict()`` failed this epoch."""
        if self._own is None:
            return self.draw_states
        own = self._own.saved()
        if own is None:
            raise ValueError(
                "state_dict(): the sampler's own state_dict() failed in this epoch, so the epoch cannot be "
                f"drawn again ({self._own.unsaved})"
            )
        return {**self.draw_states, OWN: own}

    def handed_out(self, count: int) -> None:
        """The current epoch's first ``count`` batches were handed out."""
        if self._own is not None:
            self._own.handed_out(count)

    def _redrawn(self, start: int) -> Iterator[Any]:
        """The saved epoch drawn again from its states, from position ``start`` on; torch's global random
        state is the process's own again once the handed-out part is skipped. A sampler whose own state
        moves is loaded as it was saved and goes on after the batches it had drawn ahead."""
        parts = stateful_parts(self.inner)
        own_saved = self.draw_states.get(OWN)
        restore_generators(self._generators(), self.draw_states)
        if own_saved is not None and "now" in own_saved:
            load(parts, own_saved["now"])
            self._own = OwnStates(parts, first=start, moving=True)
            yield from self._own.watch(itertools.chain(own_saved["ahead"], self.inner))
            return
        own = torch.get_rng_state()
        torch.set_rng_state(self.draw_states[GLOBAL])
        if own_saved is not None:
            load(parts, own_saved["start"])
        self._own = OwnStates(parts, first=start, moving=False) if parts else None
        order = iter(self.inner)
        try:
            first = next(itertools.islice(order, start, None))
        except StopIteration:
            return
        finally:
            torch.set_rng_state(own)
        order = itertools.chain([first], order)
        yield from order if self._own is None else self._own.watch(order)

    def _generators(self) -> dict[str, torch.Generator | None]:
        method = self._loader_generators()
        if method is not None:
            self._last_generators = method()
        return self._last_generators

    def resume(self, draw_states: dict[str, Any], position: int) -> None:
        """Make the next epoch the one drawn from ``draw_states``, from ``position`` on. Raises ValueError
        where they hold the own state of a sampler this loader does not have."""
        own = draw_states.get(OWN, {})
        missing = set(own.get("now", own.get("start", {}))) - set(stateful_parts(self.inner))
        if missing:
            raise ValueError(
                f"the state holds the own state_dict() of the saved loader's {', '.join(sorted(missing))}, "
                "which this loader does not have (or has without state_dict/load_state_dict)"
            )
        self._pending = (draw_states, position)

    def before_next_draw(self, callback: Any) -> None:
        """Call ``callback()`` once, just before the next epoch's order is drawn from the inner sampler."""
        self._before_draw = callback

    def pending(self) -> tuple[dict[str, Any], int] | None:
        """The restored epoch's draw states and position, where its order is not drawn yet."""
        return self._pending

    def next_orders(self, sampler: DistributedSampler) -> Orders:
        """Every rank's order of the next epoch, from the ``DistributedSampler`` this loader draws from, read
        before the epoch is drawn: the sampler's own, or where a restored epoch is pending, what each rank
        has left of it (``_world_change.resumed_orders``)."""
        if self._pending is None:
            return lambda rank: order_of(sampler, rank)
        draw_states, start = self._pending
        return resumed_orders(self.inner, sampler, draw_states.get(WORLD), start)

    def next_start(self) -> int:
        """Position at which the next epoch begins: 0, or where a resumed epoch left off."""
        return 0 if self._pending is None else self._pending[1]


def generator_states(generators: dict[str, torch.Generator | None]) -> dict[str, torch.Tensor]:
    return {name: g.get_state() for name, g in generators.items() if g is not None}


def restore_generators(generators: dict[str, torch.Generator | None], states: dict[str, Any]) -> None:
    for name, state in states.items():
        generator = generators.get(name) if name not in (GLOBAL, OWN, LISTED, WORLD) else None
        if generator is not None:
            generator.set_state(state)
