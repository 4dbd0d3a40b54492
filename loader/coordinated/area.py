"""The staging area of one group: a private folder in /dev/shm with the lock, the table and the batch files.

Every process that uses it (each job's main process and its workers) takes a writer id, a byte lock the
kernel releases when the process dies (see ``loader.cache._locks``): a claim or a membership names its writer,
so a job killed with SIGKILL is seen as dead by the next process that looks. The folder is made 0700 and
used only when it is ours and private (``loader.cache._private``); when the last member leaves it goes whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from loader.cache._locks import LockTimeout, forget_writer, writer_alive, writer_id
from loader.cache._private import open_private, private_dir
from loader.coordinated._order import read_order, write_order
from loader.coordinated._state import ACTIVE, CLAIMED, EMPTY, FAILED, FREE, READY, UNCLAIMED, State

__all__ = ["DONE", "WAIT", "Area", "LockTimeout"]

DONE, WAIT = -1, -2  # what ``claim`` returns when it has no batch to give
_LOCK_TIMEOUT = 30.0


class Area:
    """One group's folder ``parent/name``; pickles as its path, so a worker attaches on first use."""

    def __init__(self, parent: str | os.PathLike, name: str, num_batches: int, window: int) -> None:
        self.parent, self.name = Path(parent), name
        self.path = self.parent / name
        self.num_batches, self._window = num_batches, min(window, num_batches)
        self._open: tuple[int, int, State] | None = None  # (pid, lock fd, state) of this process

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": None}

    @contextlib.contextmanager
    def locked(self) -> Iterator[State]:
        """The table, with the group's lock held (a ``LockTimeout`` after 30 s of waiting)."""
        fd, state = self._attach()
        deadline = time.monotonic() + _LOCK_TIMEOUT
        pause = 0.0002
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LockTimeout(f"another process held the lock of {self.path} too long") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.01)
        try:
            yield state
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def state(self) -> State:
        """The table, for a look without the lock."""
        return self._attach()[1]

    def me(self) -> tuple[int, int]:
        """This process's writer id in the group."""
        self._attach()
        return writer_id(self.path)

    def alive(self, writer: int, gen: int) -> bool:
        return writer_alive(self.path, (writer, gen))

    def _attach(self) -> tuple[int, State]:
        if self._open is not None and self._open[0] == os.getpid():
            return self._open[1], self._open[2]
        self._open = None  # a forked child: the lock is per open file, so it opens its own
        folder = private_dir(self.parent, self.name)
        for name in ("lock", "writers", "state"):
            with contextlib.suppress(FileExistsError):
                os.close(os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_RDWR, 0o600))
        lock_fd = open_private(folder, "lock", os.O_RDWR)
        state_fd = open_private(folder, "state", os.O_RDWR)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                state = State(state_fd, self.num_batches, self._window)
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(state_fd)
        if state.num_batches != self.num_batches:
            raise ValueError(
                f"the staging area {folder} is for {state.num_batches} batches, not {self.num_batches}"
            )
        self._open = (os.getpid(), lock_fd, state)
        return lock_fd, state

    # --- members ---

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

    def close(self) -> None:
        if self._open is not None and self._open[0] == os.getpid():
            os.close(self._open[1])
            self._open[2].close()
            forget_writer(self.path)
        self._open = None

    # --- epochs and batches ---

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

    def order(self, epoch: int) -> list[list[int]]:
        return read_order(self.path / f"order-{epoch}", self.num_batches)

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
                if slot["state"] == CLAIMED and self.alive(int(slot["writer"]), int(slot["gen"])):
                    continue
                if g >= floor + self._window:
                    return WAIT
                slot["writer"], slot["gen"] = self.me()
                slot["state"], slot["member"] = CLAIMED, m
                return g
            return DONE

    def batch_file(self, g: int) -> Path:
        return self.path / f"b-{g}"

    def error_file(self, g: int) -> Path:
        return self.path / f"e-{g}"

    def failed_batch(self, g: int, message: str) -> None:
        """Batch ``g`` could not be prepared: every job that reaches it raises ``message``."""
        path = self.error_file(g)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(message)
        with self.locked() as state:
            slot = state.slot(g)
            if slot["g"] == g and slot["state"] == CLAIMED:
                slot["state"] = FAILED

    def failure(self, g: int) -> str:
        fd = open_private(self.path, self.error_file(g).name, os.O_RDONLY)
        with os.fdopen(fd) as f:
            return f.read(20_000)

    def published_batch(self, g: int, m: int, nbytes: int, cpu: float) -> None:
        """Under the lock: batch ``g`` (written to its file) is ready; member ``m``'s process made it."""
        with self.locked() as state:
            slot = state.slot(g)
            row = state.members[m]
            row["prepared"] += 1
            row["prep_cpu"] += cpu
            if slot["g"] != g or g < state.floor():  # taken over, or no longer wanted
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.batch_file(g))
                return
            slot["state"], slot["nbytes"], slot["cpu"], slot["member"] = READY, nbytes, cpu, m

    def consumed(self, m: int, g: int) -> None:
        """Member ``m`` has taken batch ``g``: its position moves on and what no one needs goes."""
        with self.locked() as state:
            row, slot = state.members[m], state.slot(g)
            row["position"], row["consumed"] = g + 1, row["consumed"] + 1
            if int(slot["member"]) != m:
                row["cpu_saved"] += float(slot["cpu"])
            self.free_consumed(state)

    def window(self) -> int:
        return self._window
