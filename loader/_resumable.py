"""Resuming a ``loader.DataLoader`` mid-epoch: ``state_dict`` says where the epoch stands (its whole order,
the batches handed out, the generators' states) and ``load_state_dict`` makes the next iterator yield exactly
the rest, in this process or a new one. A mixin: the loader keeps the order (``_replay``) and counts."""

from __future__ import annotations

from typing import Any

from loader._resume import generator_states, restore_generators

__all__ = ["STATE_VERSION", "ResumableEpochs"]

STATE_VERSION = 1


class ResumableEpochs:
    """``state_dict`` / ``load_state_dict`` of a DataLoader whose map-style order is a ReplayableSampler
    (``_replay``; None for an iterable dataset), with ``_delivered``, ``_started_before``,
    ``_made_iterator`` and ``_resume`` kept by the loader as its iterators start and hand out batches."""

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
        return {
            "version": STATE_VERSION,
            "epoch_order": list(self._replay.epoch_order) if started else [],
            "batches_delivered": self._delivered,
            "generators": generator_states(self._generators()),
            # an iterator made whose order is not drawn yet: its base seed is drawn, the order comes next
            "order_next": self._made_iterator and not started,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``iter(loader)`` yield exactly the rest of the saved epoch."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a loader.DataLoader state of version {STATE_VERSION}")
        order, done = state["epoch_order"], state["batches_delivered"]
        if not 0 <= done <= len(order):
            raise ValueError(f"batches_delivered={done} is outside the saved epoch of {len(order)} batches")
        if self._replay is None:
            raise TypeError("load_state_dict() needs a map-style dataset")
        if done < len(order):
            self._replay.resume(order, done)
        mid_epoch, order_next = done < len(order), bool(state.get("order_next"))
        self._resume = (state["generators"], mid_epoch, order_next or self.persistent_workers)

    def _iter_resumed(self) -> Any:
        """The first iterator after ``load_state_dict``: the generators make the same draws as the saved
        loader's would have. Torch draws the workers' base seed when an iterator is made, then the order."""
        states, mid_epoch, order_next = self._resume
        self._resume = None
        restore = lambda: restore_generators(self._generators(), states)  # noqa: E731
        if not mid_epoch and not order_next:
            restore()  # the next epoch draws a base seed and its order, as the saved loader's next would
            return super().__iter__()
        if not mid_epoch:  # the base seed was drawn (or persistent workers keep theirs): the order is next
            self._replay.before_next_draw(restore)
            return super().__iter__()
        inner = super().__iter__()  # the rest of the epoch is replayed and draws nothing
        restore()
        return inner

    def _count_delivered(self) -> None:
        self._delivered += 1

    def _generators(self) -> dict[str, Any]:
        return {"loader": self.generator, "sampler": getattr(self.sampler, "generator", None)}
