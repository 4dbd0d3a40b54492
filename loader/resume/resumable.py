"""Resuming a ``loader.DataLoader`` mid-epoch: ``state_dict`` says where the epoch stands (the random states
its order was drawn from, the batches handed out, the generators' states now) and ``load_state_dict`` makes
the next iterator draw that order again and yield exactly the rest, in this process or a new one. A mixin:
the loader keeps the sampler (``_replay``) and counts."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from loader.resume.position import generator_states, restore_generators
from loader.resume.tracking import Tracking
from loader.resume.worker_random import RandomStates

__all__ = ["STATE_VERSION", "ResumableEpochs"]

STATE_VERSION = 4  # 1 kept the epoch's whole order; 2 had no workers' random states; 3 kept a stateful
# sampler's whole order (2 and 3 read still)


class ResumableEpochs:
    """``state_dict`` / ``load_state_dict`` of a DataLoader whose map-style order is a ReplayableSampler
    (``_replay``; None for an iterable dataset), with ``_delivered``, ``_started_before``, ``_made_iterator``
    and ``loader.resume.position`` kept by the loader as its iterators start and hand out batches."""

    # set again, never changed in place: these are the loader's until its first iterator
    _delivered = 0  # batches of the current epoch handed out
    _started_before = 0  # epochs the sampler had started when the current iterator was made
    _made_iterator = False
    _resume: tuple[dict[str, Any], bool, bool] | None = None  # (states, mid-epoch?, order next?)
    _worker_states: Mapping[int, RandomStates] = MappingProxyType({})  # by worker: its last batch's
    _workers_from: tuple[dict[int, RandomStates], int, int | None] | None = None  # (states, turn, seed)
    _workers_seed: int | None = None  # the base seed the current workers started from

    def state_dict(self) -> dict[str, Any]:
        """Where the current epoch stands: its whole order and how many batches were handed out."""
        if self._replay is None:
            raise TypeError(
                "state_dict() needs a map-style dataset; an IterableDataset keeps its own position"
            )
        if self._coordinated is not None:
            raise TypeError(
                "state_dict() is not available with coordinate: the group, not the job, has the order"
            )
        if not self.in_order and self.num_workers > 0:
            raise ValueError(
                "state_dict() needs in_order=True: with in_order=False batches arrive out of order"
            )
        started = self._replay.epochs_started > self._started_before  # this iterator's order is drawn
        # a restored epoch not drawn again yet (no batch taken since load_state_dict): saved as it was loaded
        pending = None if started else self._replay.pending()
        draw_states, delivered = pending or (self._replay.saved_draw() if started else {}, self._delivered)
        finished = started and self._epoch_finished()
        if self.ready_first and started and delivered and not finished:
            raise ValueError(
                "state_dict() with ready_first=True is exact between epochs only: mid-epoch, a batch holds "
                "samples of several of the order's batches, so the epoch's rest is not a count of batches"
            )
        return {
            "version": STATE_VERSION,
            "draw_states": draw_states,
            "batches_delivered": delivered,
            "epoch_finished": finished,
            "generators": generator_states(self._generators()),
            # an iterator made whose order is not drawn yet: its base seed is drawn, the order comes next
            "order_next": self._made_iterator and not started and pending is None,
            "iterator_made": self._made_iterator,
            "worker_random": dict(self._worker_states),
            "workers_seed": self._workers_seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``iter(loader)`` yield exactly the rest of the saved epoch."""
        version = state.get("version") if isinstance(state, dict) else None
        if version not in (2, 3, STATE_VERSION):
            raise ValueError(
                f"not a loader.DataLoader state of version 2 to {STATE_VERSION}, got {version!r}"
            )
        draw_states, done = state["draw_states"], state["batches_delivered"]
        if isinstance(done, bool) or not isinstance(done, int) or done < 0:
            raise ValueError(f"batches_delivered={done!r} is not a number of batches")
        if self._replay is None:
            raise TypeError("load_state_dict() needs a map-style dataset")
        mid_epoch = bool(draw_states) and not state["epoch_finished"]
        if mid_epoch:
            self._replay.resume(draw_states, done)
        # persistent workers keep the base seed their first iterator drew; later epochs draw only the order
        kept_seed = self.persistent_workers and bool(state["iterator_made"])
        self._resume = (state["generators"], mid_epoch, bool(state["order_next"]) or kept_seed)
        if mid_epoch or kept_seed:  # the saved loader's workers go on: the next ones start as they were
            turn = done % self.num_workers if mid_epoch and self.num_workers > 0 else 0
            self._start_workers_from(state.get("worker_random", {}), turn, state.get("workers_seed"))

    def _start_workers_from(self, states: dict[int, RandomStates], turn: int, seed: int | None) -> None:
        """The next workers take up ``states`` (by worker id) and base ``seed``, the next batch going to
        worker ``turn``; persistent workers already running are stopped, to start again so."""
        self._workers_from = (dict(states), turn, seed)
        if self._iterator is not None:
            self._iterator._shutdown_workers()
            self._iterator = None

    def _tracking(self) -> Tracking:
        """What a new iterator tells this loader, and how its new workers start."""
        restore, turn, seed = self._workers_from or ({}, 0, None)
        self._workers_from, self._worker_states = None, dict(restore)
        return Tracking(weakref.ref(self), restore, turn, seed)

    def _workers_started(self, iterator: Any) -> Any:
        """``iterator``, whose workers (if any) started from its base seed: kept for ``state_dict``."""
        self._workers_seed = iterator._base_seed
        return iterator

    def _keep_states(self, worker: int, changed: RandomStates) -> None:
        """A batch of ``worker`` handed out: its random states now (a stamp holds those that changed)."""
        self._worker_states[worker] = {**self._worker_states.get(worker, {}), **changed}

    def _epoch_finished(self) -> bool:
        """Whether every batch of the current epoch was handed out (never, for an endless sampler)."""
        try:
            return self._delivered >= self._replay.epoch_length()
        except TypeError:
            return False

    def _iter_resumed(self) -> Any:
        """The first iterator after ``load_state_dict``: the generators make the same draws as the saved
        loader's would have. Torch draws the workers' base seed when an iterator is made, then the order."""
        states, mid_epoch, order_next = self._resume
        self._resume = None
        generators = self._generators()  # not self: the sampler holding ``restore`` must not keep the loader
        restore = lambda: restore_generators(generators, states)  # noqa: E731
        if not mid_epoch and not order_next:
            restore()  # the next epoch draws a base seed and its order, as the saved loader's next would
            return super().__iter__()
        if not mid_epoch:  # the base seed was drawn (or persistent workers keep theirs): the order is next
            self._replay.before_next_draw(restore)
            return super().__iter__()
        return super().__iter__()  # the sampler draws the epoch again from its saved states, then skips

    def _count_delivered(self) -> None:
        self._delivered += 1
        self._replay.handed_out(self._delivered)

    def _generators(self) -> dict[str, Any]:
        return {"loader": self.generator, "sampler": getattr(self.sampler, "generator", None)}
