"""One job in its group, on the main process side: joining, each epoch's batches in the group's order, lag.

Each epoch the job (1) joins the group's epoch, drawing its order from its own sampler if it is the first
there, (2) sets its workers claiming and preparing batches, (3) takes batch after batch from the staging area
in the group's order, preparing one itself only when nothing else will (no workers, or a dead preparer).
A job that comes while the group's epoch is past its first batch runs that epoch alone and joins at the
next; a job the group detached for lagging, or that found the group's table locked by a stopped process for
longer than its patience, runs alone from then on. Either way it says so.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from loader.coordinated._state import (
    ACTIVE,
    CLAIMED,
    DETACHED,
    EMPTY,
    FAILED,
    FREE,
    PENDING,
    READY,
    UNCLAIMED,
)
from loader.coordinated.area import Area, LockTimeout
from loader.coordinated.options import Coordination, CoordinationStats, CoordinationWarning, PrepFailed
from loader.coordinated.prep import Preparer

__all__ = ["Member"]

_REAP_EVERY = 0.5  # seconds between liveness checks of a job that waits: a dead job is seen this fast
_UNCLAIMED_WAIT = 1.0  # seconds a needed batch may stay unclaimed before the main process prepares it
_DETACHED = "the group detached it: it fell behind by more than its staged batches"


class Member:
    """This job's membership; ``epoch(...)`` yields one epoch's batches."""

    def __init__(self, area: Area, options: Coordination, preparer: Preparer, num_workers: int) -> None:
        self.area, self.options, self.preparer, self.num_workers = area, options, preparer, num_workers
        self.row: int | None = None
        self.alone_why = ""
        self._epochs_begun = 0
        self._held_back_since: float | None = None  # since when every batch waited on a lagging job
        self._final: CoordinationStats | None = None  # what stats() said when the job left
        self.locked_out = False  # the group's table stayed locked (a stopped holder): it is left alone

    def epoch(
        self,
        draw_order: Callable[[], list[list[int]]],
        plain: Callable[[], Iterator[Any]],
        alone: Callable[[list[list[int]]], Iterator[Any]],
        start_prep: Callable[[int], Iterator[Any] | None],
    ) -> Iterator[Any]:
        """The epoch's batches: the group's (from the staging area), or this job's own when it runs alone."""
        epoch = None if self.alone_why else self._locked_out(self._begin, draw_order)
        if epoch is None or epoch is _ALONE:
            yield from plain()
            return
        B = self.area.num_batches
        order = self.area.order(epoch)  # kept: a job stopped long enough may find the group epochs ahead
        prep = start_prep(epoch)
        try:
            for g in range(epoch * B, (epoch + 1) * B):
                batch = self._locked_out(self._take, g, (epoch + 1) * B)
                if batch is _ALONE:
                    yield from alone(order[g - epoch * B :])
                    return
                yield batch
        finally:
            self._skip_to((epoch + 1) * B)
            if prep is not None:
                for _ in prep:  # the workers stop claiming once this job is past the epoch
                    pass

    def _begin(self, draw_order: Callable[[], list[list[int]]]) -> int | None:
        """The group epoch this job takes part in next, or None: it runs this one alone."""
        B = self.area.num_batches
        with self.area.locked() as state:
            self.area.reap(state)
            if self.row is None or state.members[self.row]["status"] == EMPTY:
                self.row = self.preparer.row = self._join(state)
            row = state.members[self.row]
            if row["status"] == DETACHED:
                self._go_alone(_DETACHED)
                return None
            epoch = -(-int(row["position"]) // B)
            if row["status"] == PENDING:
                first = state.slot(epoch * B)
                if self._epochs_begun == 0 or (
                    state.published >= epoch and (first["g"] != epoch * B or first["state"] == FREE)
                ):
                    self._epochs_begun += 1
                    row["position"] = max(epoch, state.published + 1) * B  # the group's next epoch
                    return None
                row["status"] = ACTIVE
            row["position"] = epoch * B
            if state.published < epoch:
                self.area.publish_order(state, epoch, draw_order())
            self.area.free_consumed(state)
        self._epochs_begun += 1
        if self._epochs_begun == 1:
            self.area.wait_for_active(self.options.min_members, self.options.join_timeout)
        return epoch

    def _join(self, state) -> int:
        """A row for this job: in the group's current epoch if its first batch is still staged, else pending
        (this epoch runs alone; the group keeps its next epoch's first batches for it)."""
        B, last = self.area.num_batches, state.published
        if last < 0 or not state.subscribed().any():
            return self.area.join(state, ACTIVE, (last + 1) * B)
        first = state.slot(last * B)
        if first["g"] == last * B and first["state"] != FREE:
            return self.area.join(state, ACTIVE, last * B)
        warnings.warn(
            f"coordinate: the group {self.area.name} is mid-epoch; this job runs this epoch alone and joins "
            "at the next one",
            CoordinationWarning,
            stacklevel=5,
        )
        return self.area.join(state, PENDING, (last + 1) * B)

    def _take(self, g: int, limit: int) -> Any:
        """Batch ``g`` from the staging area, once it is ready."""
        pause, unclaimed_since, last_reap = 0.0002, None, time.monotonic()
        held_back = False
        while True:
            state = self.area.state()
            if state.members[self.row]["status"] != ACTIVE:
                return self._go_alone(_DETACHED)
            slot = state.slot(g)
            if slot["g"] == g and slot["state"] == FAILED:
                epoch, b = divmod(g, self.area.num_batches)
                raise PrepFailed(
                    f"coordinate: batch {b} of epoch {epoch} (samples {self.area.order(epoch)[b]}) could not "
                    f"be prepared, in {self.area.failure(g)}"
                )
            if slot["g"] == g and slot["state"] == READY:
                batch = self.area.take_staged(g)
                if batch is not None:
                    self.area.consumed(self.row, g)
                    if not held_back:
                        self._held_back_since = None
                    return batch
                continue
            now = time.monotonic()
            unclaimed = slot["g"] == g and slot["state"] == UNCLAIMED
            unclaimed_since = (unclaimed_since or now) if unclaimed else None
            lapsed = slot["g"] == g and slot["state"] == CLAIMED and not self.area.held(slot)  # dead, stopped
            if self.num_workers == 0 or lapsed or (unclaimed and now - unclaimed_since > _UNCLAIMED_WAIT):
                mine = self.area.claim(self.row, limit)
                if mine >= 0:
                    self.preparer.prepare(mine)
                    continue
            if now - last_reap > _REAP_EVERY:
                with self.area.locked() as state:
                    self.area.reap(state)
                last_reap = now
            floor = state.floor()  # patience counts across an epoch's end too: a stopped job holds no one
            if g >= floor + self.area.window():
                held_back, self._held_back_since = True, self._held_back_since or now
                if now - self._held_back_since > self.options.patience and self.options.on_lag == "detach":
                    self.area.detach_laggards(self.row, g)
                    self._held_back_since = None
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    def _skip_to(self, end: int) -> None:
        """Past this epoch (finished, or left early by the training loop): the group need not keep its
        batches for this job, and its workers stop claiming."""
        if self.locked_out:
            return
        with contextlib.suppress(Exception), self.area.locked() as state:
            row = state.members[self.row]
            if row["status"] == ACTIVE and row["pid"] == os.getpid():
                row["position"] = max(int(row["position"]), end)
                self.area.free_consumed(state)

    def _locked_out(self, step: Callable[..., Any], *args: Any) -> Any:
        """``step(*args)``, or going on alone where the group's table stayed locked (``LockTimeout``): a batch
        taken but not yet counted is made again alone, so none is lost or given twice."""
        try:
            return step(*args)
        except LockTimeout as exc:
            self.locked_out = True  # the table is not waited for again: the job's row is reaped when it exits
            return self._go_alone(str(exc))

    def _go_alone(self, why: str) -> Any:
        self.alone_why = why
        warnings.warn(f"coordinate: this job goes on alone: {why}", CoordinationWarning, stacklevel=5)
        return _ALONE

    def stats(self) -> CoordinationStats:
        name = self.options.group or self.area.name
        if self._final is not None:
            return self._final
        if self.row is None:
            return CoordinationStats(name, "not started", 0, 0, 0, 0.0, 0.0)
        state = self.area.state()
        return CoordinationStats.of_row(name, state.members[self.row], state, self.alone_why)

    def leave(self) -> None:
        """Out of the group (the last one out removes the staging area); ``stats()`` keeps its figures."""
        if self.row is None:  # never joined: the area made for it goes if no one else has used it
            with contextlib.suppress(OSError):
                os.rmdir(self.area.path)
        if self.row is not None:
            with contextlib.suppress(Exception):
                self._final = self.stats()
                if not self.locked_out:
                    self.area.leave(self.row)
            self.row = None


_ALONE = object()
