"""A group's folder: private to this user, attached once per process, with the lock and the table.

Every process that uses it (each job's main process and its workers) takes a writer id, a byte lock the
kernel releases when the process dies (see ``loader.system.locks``): a claim or a membership names its writer,
so a job killed with SIGKILL is seen as dead by the next process that looks. The folder is made 0700 and
used only when it is ours and private (``loader.system.private``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from loader.coordinated._order import read_order
from loader.coordinated._state import ACTIVE, State
from loader.system.locks import LockTimeout, forget_writer, writer_alive, writer_id
from loader.system.private import open_private, private_dir

__all__ = ["Folder", "LockTimeout"]

_LOCK_WAIT = 30.0  # seconds: a lock is held for microseconds, so a longer wait means its holder stopped


class Folder:
    """One group's folder ``parent/name``; pickles as its path, so a worker attaches on first use."""

    def __init__(
        self,
        parent: str | os.PathLike,
        name: str,
        num_batches: int,
        window: int,
        lock_wait: float = _LOCK_WAIT,
    ) -> None:
        self.parent, self.name, self.lock_wait = Path(parent), name, lock_wait
        self.path = self.parent / name
        self.num_batches, self._window = num_batches, min(window, num_batches)
        self._open: tuple[int, int, State] | None = None  # (pid, lock fd, state) of this process

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": None}

    @contextlib.contextmanager
    def locked(self) -> Iterator[State]:
        """The table, with the group's lock held (a ``LockTimeout`` after ``lock_wait`` seconds of waiting:
        a process stopped or hung while it held the lock)."""
        fd, state = self._attach()
        deadline = time.monotonic() + self.lock_wait
        pause = 0.0002
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LockTimeout(
                        f"another process held the lock of {self.path} for over {self.lock_wait:g} s "
                        "(stopped or hung while it held it)"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.01)
        try:
            yield state
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def state(self) -> State:
        """The table, for a look without the lock."""
        return self._attach()[1]

    def wait_for_active(self, members: int, timeout: float) -> None:
        """Until ``members`` members are active, or ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.state().members["status"] == ACTIVE).sum() >= members:
                return
            time.sleep(0.01)

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

    def close(self) -> None:
        if self._open is not None and self._open[0] == os.getpid():
            os.close(self._open[1])
            self._open[2].close()
            forget_writer(self.path)
        self._open = None

    # --- epochs and batches ---

    def order(self, epoch: int) -> list[list[int]]:
        return read_order(self.path / f"order-{epoch}", self.num_batches)

    def batch_file(self, g: int) -> Path:
        return self.path / f"b-{g}"

    def error_file(self, g: int) -> Path:
        return self.path / f"e-{g}"

    def write_error(self, g: int, message: str) -> None:
        """Why batch ``g`` could not be prepared, in a file of its own (0600, never through a link)."""
        path = self.error_file(g)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(message)

    def failure(self, g: int) -> str:
        """What ``write_error`` left for batch ``g`` (its first 20,000 characters)."""
        fd = open_private(self.path, self.error_file(g).name, os.O_RDONLY)
        with os.fdopen(fd) as f:
            return f.read(20_000)

    def window(self) -> int:
        return self._window
