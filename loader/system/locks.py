"""The store's two kinds of lock, both released by the kernel when their holder dies.

* The mutex around reservations: ``flock`` on the store's ``lock`` file, one open file per process (flock is
  per open file) plus a thread lock (threads share that file). Waiting for it has a timeout: a process that
  stops while holding it (SIGSTOP, a debugger) must not hang every other job.
* Writers: each process that writes holds a POSIX byte lock on byte ``k`` of the ``writers`` file for as
  long as it lives, bumps ``k``'s generation (a u32 at ``4 * k`` in the same file) when it claims ``k``, and
  names ``(k, generation)`` in the slots it reserves. A slot's writer is dead when byte ``k`` is free, or held
  by a later generation (a new process that took ``k`` after the writer died).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from loader.system.private import open_private

__all__ = ["MAX_WRITERS", "LockTimeout", "StoreMutex", "forget_writer", "writer_alive", "writer_id"]

MAX_WRITERS = 4096
_setup_lock = threading.Lock()  # guards each process's one-time setups; made anew in a forked child
_writer_files: dict[Path, tuple[int, Writer]] = {}  # store -> (fd of its writers file, this process)
_GENERATION = struct.Struct("<I")
Writer = tuple[int, int]  # (k, generation)


def _after_fork() -> None:
    global _setup_lock
    _setup_lock = threading.Lock()
    for fd, _ in _writer_files.values():  # POSIX locks are not inherited: a child claims its own id
        with contextlib.suppress(OSError):
            os.close(fd)
    _writer_files.clear()


os.register_at_fork(after_in_child=_after_fork)


class LockTimeout(TimeoutError):
    """The store's mutex was held by another process for longer than the timeout."""


class StoreMutex:
    """Excludes other processes and threads from a store's reservations, for at most ``timeout`` seconds."""

    def __init__(self, folder: Path, timeout: float) -> None:
        self.folder = folder
        self.timeout = timeout
        self._state: tuple[int, int | None, threading.Lock | None] = (-1, None, None)

    @contextlib.contextmanager
    def held(self, timeout: float | None = None) -> Iterator[None]:
        """The lock, waited for at most ``timeout`` seconds (the mutex's own where None), else LockTimeout."""
        wait = self.timeout if timeout is None else timeout
        fd, thread_lock = self._process_lock()
        deadline = time.monotonic() + wait
        if not thread_lock.acquire(timeout=wait):
            raise LockTimeout(f"another thread held the lock of {self.folder} for {wait:g} s")
        try:
            _flock_before(fd, deadline, self.folder)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            thread_lock.release()

    def close(self) -> None:
        """Close the lock file, this process's own or the copy a forked child inherited (flock belongs to
        the open file: a parent killed while holding it would stay the holder while the child lives)."""
        fd = self._state[1]
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._state = (-1, None, None)

    def _process_lock(self) -> tuple[int, threading.Lock]:
        state = self._state
        if state[0] != os.getpid():
            with _setup_lock:
                state = self._state
                if state[0] != os.getpid():
                    self.close()  # a forked child's inherited copy
                    state = (os.getpid(), open_private(self.folder, "lock", os.O_RDWR), threading.Lock())
                    self._state = state
        return state[1], state[2]


_SPIN_S = 0.002  # how long a waiter for the store's lock yields the CPU before it starts to sleep


def _flock_before(fd: int, deadline: float, folder: Path) -> None:
    """The lock, or LockTimeout at ``deadline``. The lock is held for microseconds: a waiter first yields
    the CPU (on a busy machine the holder may be waiting for it), and sleeps only after ``_SPIN_S``."""
    spin_until, pause = time.monotonic() + _SPIN_S, 0.0002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            now = time.monotonic()
            if now >= deadline:
                raise LockTimeout(f"another process has held the lock of {folder} too long") from None
            if now < spin_until:
                os.sched_yield()
                continue
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def writer_id(folder: Path) -> Writer:
    """This process's ``(k, generation)`` for the store in ``folder``, claimed once per process."""
    found = _writer_files.get(folder)
    if found is None:
        with _setup_lock:
            found = _writer_files.get(folder)
            if found is None:
                found = _writer_files[folder] = _claim(folder)
    return found[1]


def writer_alive(folder: Path, writer: Writer) -> bool:
    """Whether the process that reserved as ``writer`` still lives (this process: always)."""
    mine = writer_id(folder)
    if writer[0] == mine[0]:  # our own byte: never test it (our own lock would be let go); an older
        return writer == mine  # generation of it is a process that died before we took it
    fd, k = _writer_files[folder][0], writer[0]
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, k)
    except OSError:  # byte k is held: by the writer, or by a later process that took k after it died
        return _generation(fd, k) == writer[1]
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, k)
    return False


def _claim(folder: Path) -> tuple[int, Writer]:
    fd = open_private(folder, "writers", os.O_RDWR)
    for k in range(1, MAX_WRITERS + 1):
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, k)
        except OSError:
            continue
        generation = (_generation(fd, k) + 1) % 2**32
        os.pwrite(fd, _GENERATION.pack(generation), _GENERATION.size * k)
        return fd, (k, generation)
    os.close(fd)
    raise LockTimeout(f"all {MAX_WRITERS} writer ids of {folder} are held by live processes")


def _generation(fd: int, k: int) -> int:
    raw = os.pread(fd, _GENERATION.size, _GENERATION.size * k)
    return _GENERATION.unpack(raw)[0] if len(raw) == _GENERATION.size else 0


def forget_writer(folder: Path) -> None:
    """Give up this process's writer id of a store that is being removed."""
    with _setup_lock:
        found = _writer_files.pop(folder, None)
    if found is not None:
        with contextlib.suppress(OSError):
            os.close(found[0])
