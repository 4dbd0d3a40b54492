"""Hits and misses shared by every process that reads through one ``CachedFiles`` (see ``_SharedCounts``)."""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import shutil
import threading
import uuid
import weakref
from pathlib import Path

import numpy as np

from loader.cache import store_path
from loader.system.private import open_private, private_dir

__all__ = ["SharedCounts"]

_ROW = 16  # a process's row of the counts file: hits, misses (int64 each)
_pid = os.getpid()  # kept current across forks, so a count costs no getpid() call
_claiming = threading.Lock()


def _forked() -> None:
    global _pid, _claiming
    _pid, _claiming = os.getpid(), threading.Lock()


os.register_at_fork(after_in_child=_forked)


class SharedCounts:
    """Hits and misses of every process that shares one ``CachedFiles``: one row per process in a file.

    A process claims its row with one ``O_APPEND`` write (the kernel makes appends atomic, so no lock is
    shared between processes) and adds into its own mapped row, so the counts of a worker that is killed
    stay. Correct with fork (a child claims its own row) and spawn (it attaches by path). The file lives in
    a private folder of ``cache_dir``, which the process that made it removes when it closes or exits;
    folders left by a process that was killed are removed by the next one made.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._pid = -1

    @classmethod
    def create(cls, cache_dir: str | os.PathLike) -> SharedCounts:
        user = store_path(cache_dir, "").parent
        private_dir(user.parent, user.name)
        _sweep(user)
        folder = user / f"files-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        os.mkdir(folder, 0o700)
        os.close(os.open(folder / "counts", os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        counts = cls(folder)
        counts._owner = weakref.finalize(counts, _remove, folder, os.getpid())
        return counts

    def add(self, column: int) -> None:
        """Count one hit (column 0) or miss (1) for the calling process."""
        if self._pid != _pid:
            self._claim()
        with self._lock:
            self._row[column] += 1

    def totals(self) -> tuple[int, int]:
        """(hits, misses) over all rows; raises OSError once the maker has removed the folder."""
        with io.FileIO(open_private(self.folder, "counts", os.O_RDONLY), "r") as f:
            raw = f.readall()
        rows = np.frombuffer(raw, np.int64, len(raw) // _ROW * 2).reshape(-1, 2)
        hits, misses = rows.sum(axis=0).tolist() if len(rows) else (0, 0)
        return hits, misses

    def close(self) -> None:
        owner = getattr(self, "_owner", None)
        if owner is not None:
            owner()

    def __getstate__(self) -> dict:
        return {"folder": self.folder, "_pid": -1}

    def _claim(self) -> None:
        with _claiming:
            if self._pid == _pid:
                return
            self._lock = threading.Lock()
            try:
                self._map, self._row = _map_new_row(self.folder)
            except OSError:  # the folder is gone (its maker exited): reads go on, uncounted
                self._row = np.zeros(2, np.int64)
            self._pid = _pid


def _map_new_row(folder: Path) -> tuple[mmap.mmap, np.ndarray]:
    fd = open_private(folder, "counts", os.O_RDWR | os.O_APPEND)
    try:
        os.write(fd, bytes(_ROW))  # our own open file: its offset is where our append ended
        end = os.lseek(fd, 0, os.SEEK_CUR)
        start = (end - _ROW) - (end - _ROW) % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, end - start, offset=start)
    finally:
        os.close(fd)
    return mapped, np.frombuffer(mapped, np.int64, 2, end - _ROW - start)


def _remove(folder: Path, pid: int) -> None:
    if os.getpid() == pid:  # not a forked child that exits: the folder is its parent's
        shutil.rmtree(folder, ignore_errors=True)


def _sweep(user: Path) -> None:
    """Remove the folders of makers that are gone (killed before they could)."""
    for entry in user.glob("files-*-*"):
        with contextlib.suppress(ValueError, PermissionError):
            try:
                os.kill(int(entry.name.split("-")[1]), 0)
            except ProcessLookupError:
                shutil.rmtree(entry, ignore_errors=True)
