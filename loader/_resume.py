"""Mid-epoch resume: the epoch's index order is kept, so a restored loader yields exactly what remained."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

from loader._serving import FileReads, ServingWorkerInit, serving

__all__ = ["ReplayableSampler", "counting_iterator", "generator_states", "restore_generators"]


class ReplayableSampler:
    """Wraps the loader's index sampler; draws an epoch's order lazily, exactly as the wrapped one would."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.epoch_order: list[Any] = []
        self.epochs_started = 0  # how many times an epoch's order was drawn or resumed
        self._pending: tuple[list[Any], int] | None = None
        self._before_draw: Any = None

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        # a generator: nothing is drawn until the first index is asked for, as with torch's own samplers
        if self._pending is not None:
            (self.epoch_order, start), self._pending = self._pending, None
        else:
            if self._before_draw is not None:
                self._before_draw, before = None, self._before_draw
                before()
            self.epoch_order, start = list(self.inner), 0
        self.epochs_started += 1
        yield from self.epoch_order[start:]

    def resume(self, order: list[Any], position: int) -> None:
        """Make the next epoch the rest of ``order`` from ``position`` on."""
        self._pending = (order, position)

    def before_next_draw(self, callback: Any) -> None:
        """Call ``callback()`` once, just before the next epoch's order is drawn from the inner sampler."""
        self._before_draw = callback

    def next_start(self) -> int:
        """Position at which the next epoch begins: 0, or where a resumed epoch left off."""
        return 0 if self._pending is None else self._pending[1]


class _Counting:
    """Over torch's own iterator classes: counts the batches handed to the training loop (prefetched ones
    are not), and drops a batch that is only ``skip`` (all its records were bad and skipped)."""

    _on_batch: weakref.WeakMethod | None = None  # the loader's counter; weak, so the loader can be freed
    _skip: Any = None

    def __next__(self) -> Any:
        batch = super().__next__()
        self._count()
        while self._skip is not None and batch is self._skip:
            batch = super().__next__()
            self._count()
        return batch

    def _count(self) -> None:
        on_batch = self._on_batch() if self._on_batch is not None else None
        if on_batch is not None:
            on_batch()


class _CountingSingleProcessIter(_Counting, _SingleProcessDataLoaderIter):
    _serve: Any = None  # a loader's cache_files reads, served while this process loads a batch

    def _next_data(self) -> Any:
        if self._serve is None:
            return super()._next_data()
        with serving(self._serve):
            return super()._next_data()


class _CountingMultiProcessingIter(_Counting, _MultiProcessingDataLoaderIter):
    pass


def counting_iterator(
    loader: Any, on_batch: Callable[[], None] | None, skip: Any, serve: FileReads | None = None
) -> Any:
    """Torch's iterator for ``loader`` (an instance of torch's own class), counting into ``on_batch`` (if
    any); ``serve``'s reads are served in its workers, or without workers while it loads each batch."""
    if loader.num_workers == 0:
        iterator = _CountingSingleProcessIter(loader)
    elif serve is None:
        iterator = _CountingMultiProcessingIter(loader)
    else:
        user_init = loader.worker_init_fn
        loader.worker_init_fn = ServingWorkerInit(serve, user_init)  # read as the workers start
        try:
            iterator = _CountingMultiProcessingIter(loader)
        finally:
            loader.worker_init_fn = user_init
    iterator._on_batch = weakref.WeakMethod(on_batch) if on_batch is not None else None
    iterator._skip = skip
    if serve is not None and loader.num_workers == 0:
        iterator._serve = serve
    return iterator


def generator_states(generators: dict[str, torch.Generator | None]) -> dict[str, torch.Tensor]:
    return {name: g.get_state() for name, g in generators.items() if g is not None}


def restore_generators(
    generators: dict[str, torch.Generator | None], states: dict[str, torch.Tensor]
) -> None:
    for name, state in states.items():
        generator = generators.get(name)
        if generator is not None:
            generator.set_state(state)
