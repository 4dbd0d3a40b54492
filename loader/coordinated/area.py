"""The staging area of one group: who is in it, the epoch's order, the claims and the staged batches, all
changed under the group's lock (the folder, its lock and its table: ``_folder.py``). A member whose process
died is taken out by the next process that looks, its claims undone; when the last member leaves, the
folder goes whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from loader.coordinated._batchfile import BadBatchFile, read_batch
from loader.coordinated._folder import Folder, LockTimeout
from loader.coordinated._order import write_order
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
    State,
)
from loader.coordinated.options import CoordinationWarning
from loader.system.private import open_private

__all__ = ["DONE", "WAIT", "Area", "LockTimeout"]

MIN_LOCK_WAIT = 5.0  # a process preempted while it holds the table's lock on a busy machine is not stopped

DONE, WAIT = -1, -2  # what ``claim`` returns when it has no batch to give


class Area(Folder):
    """The group's operations on its table: members, the epoch's order, claims, staged batches. A claim holds
    its batch for ``patience`` seconds: after that it is taken over, whether its process is dead, stopped
    (SIGSTOP, a debugger, swapping) or only slow, and the late process's batch is dropped at its publish. A
    process stopped while it holds the table's lock holds the others for ``patience`` too (at least
    ``MIN_LOCK_WAIT``): then each goes on alone (``LockTimeout``)."""

    def __init__(
        self, parent: str | os.PathLike, name: str, num_batches: int, window: int, patience: float
    ) -> None:
        super().__init__(parent, name, num_batches, window, lock_wait=max(patience, MIN_LOCK_WAIT))
        self.patience = patience

    def held(self, slot: np.ndarray) -> bool:
        """Whether ``slot`` is claimed by a live process for no longer than ``patience`` seconds."""
        return (
            slot["state"] == CLAIMED
            and time.monotonic() - float(slot["claimed_at"]) <= self.patience
            and self.alive(int(slot["writer"]), int(slot["gen"]))
        )

    def reap(self, state: State) -> list[int]:
        """Under the lock: rows of dead members freed, claims of dead writers undone. Returns the rows."""
        dead = []
        for m in state.live_rows():
            row = state.members[m]
            if not self.alive(int(row["writer"]), int(row["gen"])):
                row["status"] = EMPTY
                dead.append(m)
        for k in np.flatnonzero(state.slots["state"] == CLAIMED):
            slot = state.slots[k]
            if not self.alive(int(slot["writer"]), int(slot["gen"])):
                slot["state"] = UNCLAIMED
        self.free_consumed(state)
        return dead

    def free_consumed(self, state: State) -> None:
        """Under the lock: remove every ready batch that every subscribed member has consumed."""
        floor = state.floor()
        for k in np.flatnonzero((state.slots["state"] != FREE) & (state.slots["g"] < floor)):
            slot = state.slots[k]
            if slot["state"] == CLAIMED and self.alive(int(slot["writer"]), int(slot["gen"])):
                continue  # a late preparer still writes it: removed at its publish
            for name in (self.batch_file(int(slot["g"])), self.error_file(int(slot["g"]))):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
            slot["state"] = FREE

    def join(self, state: State, status: int, position: int) -> int:
        """Under the lock: a row for this process as a member; its index."""
        free = np.flatnonzero(state.members["status"] == EMPTY)
        if not len(free):
            raise RuntimeError(f"the group in {self.path} has {len(state.members)} members already")
        m = int(free[0])
        writer, gen = self.me()
        row = np.zeros(1, state.members.dtype)[0]
        row["status"], row["pid"], row["writer"], row["gen"], row["position"] = (
            status,
            os.getpid(),
            writer,
            gen,
            position,
        )
        state.members[m] = row
        return m

    def leave(self, m: int) -> None:
        """This member goes; the last one out removes the folder."""
        with self.locked() as state:
            if state.members[m]["pid"] == os.getpid():
                state.members[m]["status"] = EMPTY
            self.reap(state)
            last = not state.live_rows()
            if last:
                shutil.rmtree(self.path, ignore_errors=True)
        if last:
            self.close()

    def publish_order(self, state: State, epoch: int, batches: list[list[int]]) -> None:
        """Under the lock: epoch ``epoch``'s batches (lists of indices) made the group's order."""
        if len(batches) != self.num_batches:
            raise ValueError(f"the sampler gave {len(batches)} batches, not the group's {self.num_batches}")
        write_order(self.path / f"order-{epoch}", batches)
        self.free_consumed(state)
        base = epoch * self.num_batches
        for g in range(base, base + self.num_batches):
            slot = state.slot(g)
            if slot["state"] != FREE:
                raise RuntimeError(f"batch {int(slot['g'])} of {self.path} is still staged")
            slot["g"], slot["state"] = g, UNCLAIMED
        state.header["published"] = epoch
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path / f"order-{epoch - 2}")

    def claim(self, m: int, limit: int) -> int:
        """A batch below ``limit`` for member ``m``'s process to prepare, or WAIT (none inside the window
        now) or DONE (none left: the rest are ready or being prepared by live processes)."""
        with self.locked() as state:
            row = state.members[m]
            if row["status"] != ACTIVE or row["position"] >= limit:  # left, or past that epoch
                return DONE
            floor = state.floor()
            end = min(limit, (state.published + 1) * self.num_batches)
            gs, states = state.slots["g"], state.slots["state"]
            open_ = (gs >= floor) & (gs < end) & ((states == UNCLAIMED) | (states == CLAIMED))
            for k in np.flatnonzero(open_)[np.argsort(gs[open_], kind="stable")]:
                slot, g = state.slots[k], int(gs[k])
                if self.held(slot):
                    continue
                if g >= floor + self._window:
                    return WAIT
                slot["writer"], slot["gen"] = self.me()
                slot["state"], slot["member"], slot["claimed_at"] = CLAIMED, m, time.monotonic()
                return g
            return DONE

    def failed_batch(self, g: int, message: str) -> None:
        """Batch ``g`` could not be prepared: every job that reaches it raises ``message`` (unless the claim
        was taken over meanwhile: then the batch is another process's to make)."""
        with self.locked() as state:
            slot = state.slot(g)
            if self._mine(slot, g):
                self.write_error(g, message)
                slot["state"] = FAILED

    def published_batch(self, g: int, m: int, written: Path, nbytes: int, cpu: float) -> None:
        """Batch ``g``, written to ``written``, made ready under its name; member ``m``'s process made it.
        Dropped if this process's claim was taken over (it was too late) or no one needs ``g`` any more:
        a batch enters the stream once."""
        with self.locked() as state:
            slot = state.slot(g)
            row = state.members[m]
            row["prepared"] += 1
            row["prep_cpu"] += cpu
            if not self._mine(slot, g) or g < state.floor():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(written)
                return
            os.rename(written, self.batch_file(g))
            slot["state"], slot["nbytes"], slot["cpu"], slot["member"] = READY, nbytes, cpu, m

    def _mine(self, slot: np.ndarray, g: int) -> bool:
        """Under the lock: whether this process still holds the claim on batch ``g``."""
        claim = (int(slot["writer"]), int(slot["gen"]))
        return slot["g"] == g and slot["state"] == CLAIMED and claim == self.me()

    def consumed(self, m: int, g: int) -> None:
        """Member ``m`` has taken batch ``g``: its position moves on and what no one needs goes."""
        with self.locked() as state:
            row, slot = state.members[m], state.slot(g)
            row["position"], row["consumed"] = g + 1, row["consumed"] + 1
            if int(slot["member"]) != m:
                row["cpu_saved"] += float(slot["cpu"])
            self.free_consumed(state)

    def take_staged(self, g: int) -> Any:
        """The staged batch ``g``, its tensors mapped; None (and it is prepared again) if it fails a check."""
        name = self.batch_file(g)
        try:
            fd = open_private(self.path, name.name, os.O_RDONLY)
            try:
                return read_batch(fd, str(name))
            finally:
                os.close(fd)
        except (BadBatchFile, OSError) as exc:
            warnings.warn(f"coordinate: {exc}; preparing it again", CoordinationWarning, stacklevel=6)
            with self.locked() as state:
                slot = state.slot(g)
                if slot["g"] == g and slot["state"] == READY:
                    slot["state"] = UNCLAIMED
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name)
            return None

    def detach_laggards(self, me: int, g: int) -> None:
        """Member ``me`` has waited on batch ``g`` past its patience: the members the window waits on go."""
        with self.locked() as state:
            self.reap(state)
            floor = state.floor()
            if g < floor + self.window():
                return
            for m in state.live_rows():
                row = state.members[m]
                if m != me and row["status"] in (ACTIVE, PENDING) and row["position"] == floor:
                    row["status"] = DETACHED
            self.free_consumed(state)
