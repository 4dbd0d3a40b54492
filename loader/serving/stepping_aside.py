"""When ``cache_files=`` steps aside: a Dataset's reads of files the page cache holds, or will, go to the real
``open``.

A served read costs Python's work on every file: the listing's lookup, the file's ``stat`` against its
listing, the store's checks, admission and counts: ~10-25 us a file more than the real open of a
page-cached file, ~25-50 us at a miss from storage. On 4 KB files without a step that made the digits job
slower than torch's loader: epoch 1 25-30% and later epochs 10-12% with the page cache warm, epoch 1 25%
and later epochs 8-11% with it cold (no workers; with 2, epoch 1 16-18%). And the store buys nothing for a
file the page cache holds or will keep: it is read from memory either way, and a second copy in the store
is memory the kernel cannot take back. The store pays where the page cache loses files: the job's memory
or another's pushing it out, a dataset larger than the memory spare.

So each process that serves watches what its misses find. After ``PASS_AFTER`` misses in a row whose every
page was resident before the read, or that the page cache has room to keep (the memory the job may take,
less its reserve, holds all the files four times: ``CachedFiles.page_cache_room``, asked at most once a
second: a margin for the job's growth, so that under a tight limit the store serves as before),
its reads go to the real open, as with torch's loader. A hit is probed too, one in ``PROBE_EVERY``: a job
restarted over files its page cache and its store both hold passes as well, while one whose store holds
what the page cache does not keeps serving. While passing, every ``PROBE_EVERY``-th read is a probe: one
system call asks whether its file is wholly resident (serving each probe, with its admission, cost the
digits job 8%), and one that is not where the page cache has no room (the kernel took it back, the job
grew into it) is served and turns serving back on. The main process, loading batches itself, then loads
all but one batch in ``PROBE_EVERY`` with ``open`` not replaced at all (``replaces_open``): the
replacement's own cost on each open was 3-5% of the digits loop. Reads are counted as passed
(``files_passed``) where the replacement passed them: a worker's all, the main process's in the batches
loaded with it. A filesystem whose residency the kernel will not tell keeps serving. Written by hand: the
choice is this loader's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["PASS_AFTER", "PROBE_EVERY", "ROOM_CHECK_S", "SteppingAside"]

PASS_AFTER = 64  # misses in a row the page cache holds, or will, before reads pass to the real open
PROBE_EVERY = 16  # while they pass, one read in this many asks whether its file is still resident
ROOM_CHECK_S = 1.0  # how long an answer of ``room`` stands


class SteppingAside:
    """Whether a process's reads pass to the real open (``passing``; ``skips`` says which are probes), and
    what served reads and probes found (``found``, ``found_hit``, ``probe``); ``room()``: whether the page
    cache has room to keep the files, asked at most once a ``ROOM_CHECK_S``. Per process: each worker
    learns from its own reads."""

    __slots__ = (
        "_batches_to_probe",
        "_resident_run",
        "_room",
        "_room_asked",
        "_room_said",
        "_to_probe",
        "passing",
    )

    def __init__(self, room: Callable[[], bool] | None = None) -> None:
        self.passing = False
        self._room, self._room_asked, self._room_said = room, -ROOM_CHECK_S, False
        self._resident_run = 0
        self._to_probe = self._batches_to_probe = PROBE_EVERY

    def replaces_open(self) -> bool:
        """Whether the main process loads its next batch with ``open`` replaced: always while serving; while
        passing, one batch in ``PROBE_EVERY``, whose reads probe as a worker's do."""
        if not self.passing:
            return True
        self._batches_to_probe, due = _counted_down(self._batches_to_probe)
        return due

    def skips(self) -> bool:
        """While passing: whether this read goes to the real open unasked; False every ``PROBE_EVERY``-th
        read, a probe: the caller asks whether its file is still wholly resident (``probe``)."""
        return not self.probes()

    def probes(self) -> bool:
        """Whether this read is a probe, every ``PROBE_EVERY``-th: while serving, of a hit (the caller asks
        whether the page cache holds the file too and tells ``found_hit``)."""
        self._to_probe, due = _counted_down(self._to_probe)
        return due

    def probe(self, resident: bool | None) -> bool:
        """A passing read's probe found its file ``resident``; whether reads still pass: a file not resident
        turns serving on, unless the page cache has room to keep it (a file not read yet). None (a file not
        listed, gone, or whose residency cannot be told) says nothing: the next read probes instead, so that
        a Dataset opening a file of its own beside each listed one is not probed on it alone."""
        if resident is None:
            self._to_probe = 1
        elif not resident:
            self.found(False)
        return self.passing

    def found(self, resident: bool | None) -> None:
        """A miss's finding: ``resident`` True (every page of the file was resident), False (not) or None
        (the kernel would not tell). A file not resident counts as one the page cache holds where it has
        room to keep it (``room``): read either way, it stays there."""
        if resident is None:
            return
        if resident or self._has_room():
            self._resident_run += 1
            if self._resident_run >= PASS_AFTER and not self.passing:
                self.passing, self._to_probe = True, PROBE_EVERY
            return
        self.passing, self._resident_run = False, 0

    def found_hit(self, resident: bool | None) -> None:
        """A probed hit found its file ``resident`` in the page cache too; one that is not there breaks the
        run, whatever the room: the store has it, the page cache would read it from storage."""
        if resident is False:
            self._resident_run = 0
        elif resident:
            self.found(True)

    def _has_room(self) -> bool:
        now = time.monotonic()
        if self._room is not None and now - self._room_asked >= ROOM_CHECK_S:
            self._room_said, self._room_asked = self._room(), now
        return self._room_said

    def __reduce__(self) -> tuple[type[SteppingAside], tuple[Callable[[], bool] | None]]:
        return SteppingAside, (self._room,)  # a worker learns afresh from its own reads


def _counted_down(left: int) -> tuple[int, bool]:
    """One step of a countdown of ``PROBE_EVERY``: (what is left, whether this step is the one due). A count
    a thread of the Dataset's own took below zero meanwhile is due too, and starts again."""
    return (left - 1, False) if left > 1 else (PROBE_EVERY, True)
