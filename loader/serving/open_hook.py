"""``DataLoader(cache_files=...)``: the file reads of a Dataset that opens its own files, served by a cache.

A user's Dataset names its records by path (``PIL.Image.open(path)``, ``np.load(path)``, ``open(path)``),
not by index, so the loader cannot cache them as it caches a source-backed dataset's. With ``cache_files``,
each process that runs the Dataset (every worker, forked or spawned, from its start; the main process while
it loads a batch without workers) has ``builtins.open`` and ``io.open`` (one function) replaced: a plain read,
binary or text, of a file listed under those folders gets a ``ServedFile`` holding its bytes from a
:class:`loader.serving.files.CachedFiles`, counted into the loader's ``stats()``; every other open goes to
the real one untouched. Written by hand: no library serves Python's ``open`` from a shared-memory store.

Not served (they read from storage as before, uncounted): ``os.open``/``os.read``, ``io.FileIO`` and
``open(..., buffering=0)`` (raw files), read-write modes, files of more than
``loader.serving.files.LARGEST_FILE`` bytes, ``mmap`` of a file (``ServedFile.fileno`` opens the real one),
modules that took ``open`` before the replacement (``tarfile``), and C code that opens paths itself (OpenCV,
h5py, Arrow).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from loader.fetching.fetched import Fetched, note_fetch
from loader.serving.files import CachedFiles
from loader.serving.served_file import served_file, served_text
from loader.serving.stepping_aside import SteppingAside
from loader.stats.board import StatsBoard

__all__ = ["FileReads", "ServingWorkerInit", "serving"]

_real_open: Any = builtins.open
_reads: FileReads | None = None  # what this process serves now
_busy = threading.local()  # inside our own read: its opens go to the real open


class FileReads:
    """A ``CachedFiles`` whose reads count into a loader's ``StatsBoard`` as a source-backed dataset's fetches
    do (``note_fetch``): hits and misses, their bytes and the time they took; reads of files the page cache
    holds pass to the real open (``loader.serving.stepping_aside``), counted as ``files_passed``.
    Picklable, for spawned workers."""

    def __init__(self, files: CachedFiles, board: StatsBoard) -> None:
        self.files, self.board = files, board
        self.aside = SteppingAside(files.page_cache_room)

    def read(self, path: str | bytes | os.PathLike) -> bytes | None:
        """The file's bytes as served, or None: the real open reads it."""
        aside = self.aside
        if aside.passing and (aside.skips() or aside.probe(self.files.resident(path))):
            self.board.add("files_passed", 1)
            return None
        start = time.perf_counter()
        got = self.files.read(path, aside.found)
        if got is None:
            return None
        if got.hit and aside.probes():
            aside.found_hit(self.files.resident(path))
        fetched = Fetched(got.raw, got.hit, got.admitted, time.perf_counter() - start)
        note_fetch(self.board.add, None, fetched)
        return got.raw

    @contextlib.contextmanager
    def one_batch(self) -> Iterator[None]:
        """The block's reads are admitted together at its end (``CachedFiles.hold_admissions``), counted."""
        self.files.hold_admissions()
        try:
            yield
        finally:
            admitted = self.files.admit_held()
            if admitted:  # after the batch's collate published its counts: published now
                self.board.add("records_admitted", admitted)
                self.board.flush(storage=False)


class ServingWorkerInit:
    """A worker's ``worker_init_fn``: serve ``reads`` for the worker's life, then run the user's own."""

    def __init__(self, reads: FileReads, user_init: Callable[[int], Any] | None) -> None:
        self.reads, self.user_init = reads, user_init

    def __call__(self, worker_id: int) -> None:
        _serve(self.reads)
        if self.user_init is not None:
            self.user_init(worker_id)


@contextlib.contextmanager
def serving(reads: FileReads) -> Iterator[None]:
    """Serve ``reads`` in this process for the block (the main process, loading a batch itself); what it
    reads is admitted at the block's end. While its reads pass to the real open, most blocks run with
    ``open`` untouched (``SteppingAside.replaces_open``)."""
    if not reads.aside.replaces_open():
        yield
        return
    before = _reads
    _serve(reads)
    try:
        with reads.one_batch():
            yield
    finally:
        _serve(before)


def _serve(reads: FileReads | None) -> None:
    """Open's replacement serves ``reads`` from now on; None gives the real open back."""
    global _reads, _real_open
    _reads = reads
    if reads is None:
        if builtins.open is _open:
            builtins.open = io.open = _real_open
        return
    if builtins.open is not _open:
        _real_open = builtins.open
    builtins.open = io.open = _open


def _open(
    file: Any,
    mode: str = "r",
    buffering: int = -1,
    encoding: str | None = None,
    errors: str | None = None,
    newline: str | None = None,
    closefd: bool = True,
    opener: Any = None,
) -> Any:
    """``open``, serving a plain read of a listed file, binary or text; anything else goes to the real one.
    Its checks run on every open of the process, cheapest first."""
    reads = _reads
    if (
        reads is not None
        and opener is None
        and closefd is True
        and (buffering == -1 or buffering > 1)
        and isinstance(file, (str, bytes, os.PathLike))
        and not getattr(_busy, "reading", False)
    ):
        if mode == "rb" or mode == "br":
            if encoding is errors is newline is None and (raw := _read(reads, file)) is not None:
                return served_file(raw, os.fspath(file))
        elif mode in ("r", "rt", "tr") and (raw := _read(reads, file)) is not None:
            return served_text(served_file(raw, os.fspath(file)), mode, encoding, errors, newline)
    return _real_open(file, mode, buffering, encoding, errors, newline, closefd, opener)


def _read(reads: FileReads, file: str | bytes | os.PathLike) -> bytes | None:
    """The file's bytes, or None where the real open should answer (not ours, gone, unreadable)."""
    _busy.reading = True
    try:
        return reads.read(file)
    except (OSError, ValueError, TypeError):  # the real open raises what the script expects
        return None
    finally:
        _busy.reading = False
