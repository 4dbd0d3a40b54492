"""Mid-epoch resume: the random states an epoch's order was drawn from and the batches handed out are kept, so
a restored loader draws that order again and yields exactly what remained.

The position is kept, not the order: a sampler may be endless, or list millions of indices, and listing it
before the first batch cost 1 GB and a second on 20M indices (torch's loader yields at once). Drawing again
is exact for a sampler that draws from the loader's generator, its own ``generator`` or torch's global random
state, as all of torch's samplers do; what was handed out is skipped, as torchdata's StatefulDataLoader
fast-forwards a sampler. A sampler with a ``state_dict()`` of its own (``PackedBatchSampler``) is restored by
the user, mid-epoch at the packs it handed out ahead of use: its epoch's order is kept instead.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["ReplayableSampler", "generator_states", "restore_generators"]

GLOBAL = "torch"  # the name of torch's global random state among the states kept
OWN = "order"  # and of the whole order of a sampler with a state_dict() of its own (a PackedBatchSampler)


def _stateful(sampler: Any) -> bool:
    return all(callable(getattr(sampler, name, None)) for name in ("state_dict", "load_state_dict"))


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
        self.draw_states: dict[str, torch.Tensor] = {}  # what the current epoch's draw started from
        self.epochs_started = 0  # how many times an epoch's order was drawn or resumed
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
            self.epochs_started += 1
            if _stateful(self.inner):  # its own state is restored by the user: its epoch's order is kept
                self.draw_states[OWN] = list(self.inner)
                yield from self.draw_states[OWN]
                return
            yield from self.inner
            return
        (self.draw_states, start), self._pending = self._pending, None
        self.epochs_started += 1
        if OWN in self.draw_states:
            yield from self.draw_states[OWN][start:]
            return
        yield from self._redrawn(start)

    def _redrawn(self, start: int) -> Iterator[Any]:
        """The saved epoch drawn again from its states, from position ``start`` on; torch's global random
        state is the process's own again once the handed-out part is skipped."""
        own = torch.get_rng_state()
        restore_generators(self._generators(), self.draw_states)
        torch.set_rng_state(self.draw_states[GLOBAL])
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

    def resume(self, draw_states: dict[str, torch.Tensor], position: int) -> None:
        """Make the next epoch the one drawn from ``draw_states``, from ``position`` on."""
        self._pending = (draw_states, position)

    def before_next_draw(self, callback: Any) -> None:
        """Call ``callback()`` once, just before the next epoch's order is drawn from the inner sampler."""
        self._before_draw = callback

    def next_start(self) -> int:
        """Position at which the next epoch begins: 0, or where a resumed epoch left off."""
        return 0 if self._pending is None else self._pending[1]


def generator_states(generators: dict[str, torch.Generator | None]) -> dict[str, torch.Tensor]:
    return {name: g.get_state() for name, g in generators.items() if g is not None}


def restore_generators(
    generators: dict[str, torch.Generator | None], states: dict[str, torch.Tensor]
) -> None:
    for name, state in states.items():
        generator = generators.get(name) if name not in (GLOBAL, OWN) else None
        if generator is not None:
            generator.set_state(state)
