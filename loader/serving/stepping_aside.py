"""When ``cache_files=`` steps aside: a Dataset's reads of files the page cache holds go to the real ``open``.

A served read costs Python's work on every file: the listing's lookup, the file's ``stat`` against its
listing, the store's checks and counts, ~10-25 us a file more than the real open of a page-cached file.
On 4 KB files without a step or workers that made the digits job's epoch 1 ~25-30% and its later epochs
~10-12% slower than torch's loader. And the store buys nothing for a file the page cache holds: it is read
from memory either way, and a second copy in the store is memory the kernel cannot take back.

So each process that serves watches what its misses find. After ``PASS_AFTER`` misses in a row whose every
page was resident before the read (a hit is asked too, one in ``PROBE_EVERY``: a job restarted over files
its page cache and its store both hold), its reads go to the real open, as with torch's loader, except every
``PROBE_EVERY``-th, a probe: one system call asks whether its file is still wholly resident (serving
each probe, with its admission, cost the digits job 8%), and one that is not (the kernel took the page
cache back, the job grew into it, the files were never read) is served and turns serving back on. The
main process, loading batches itself, then loads all but one batch in ``PROBE_EVERY`` with ``open`` not
replaced at all (``replaces_open``): the replacement's own cost on each open was 3-5% of the digits loop.
Reads are counted as passed (``files_passed``) where the replacement passed them: a worker's all, the main
process's in the batches loaded with it. A record
the store admitted from a read that brought its pages in has them evicted at its first hit, so a store that
filled from storage keeps serving; so does a filesystem whose residency the kernel will not tell. Written
by hand: the choice is this loader's own.
"""

from __future__ import annotations

__all__ = ["PASS_AFTER", "PROBE_EVERY", "SteppingAside"]

PASS_AFTER = 64  # misses in a row found wholly in the page cache before reads pass to the real open
PROBE_EVERY = 16  # while they pass, one read in this many asks whether its file is still resident


class SteppingAside:
    """Whether a process's reads pass to the real open (``passing``; ``skips`` says which are probes), and
    what served reads and probes found (``found``). Per process: each worker learns from its own reads."""

    __slots__ = ("_batches_to_probe", "_resident_run", "_to_probe", "passing")

    def __init__(self) -> None:
        self.passing = False
        self._resident_run = 0
        self._to_probe = self._batches_to_probe = PROBE_EVERY

    def replaces_open(self) -> bool:
        """Whether the main process loads its next batch with ``open`` replaced: always while serving; while
        passing, one batch in ``PROBE_EVERY``, whose reads probe as a worker's do."""
        if not self.passing:
            return True
        self._batches_to_probe -= 1
        if self._batches_to_probe:
            return False
        self._batches_to_probe = PROBE_EVERY
        return True

    def skips(self) -> bool:
        """While passing: whether this read goes to the real open unasked; False every ``PROBE_EVERY``-th
        read, a probe: the caller asks whether its file is still wholly resident."""
        return not self.probes()

    def probes(self) -> bool:
        """Whether this read is a probe, every ``PROBE_EVERY``-th: while serving, of a hit (the caller asks
        whether the page cache holds the file too and tells ``found``)."""
        self._to_probe -= 1
        if self._to_probe:
            return False
        self._to_probe = PROBE_EVERY
        return True

    def found(self, resident: bool | None) -> None:
        """A served read's finding: ``resident`` True (a miss whose every page was resident), False (a miss
        that was not) or None (a hit, or the kernel would not tell)."""
        if resident is None:
            return
        if not resident:
            self.passing, self._resident_run = False, 0
            return
        self._resident_run += 1
        if self._resident_run >= PASS_AFTER:
            self.passing, self._to_probe = True, PROBE_EVERY

    def __reduce__(self) -> tuple[type[SteppingAside], tuple[()]]:
        return SteppingAside, ()  # a worker learns afresh from its own reads
