"""Whether keeping records in the page cache pays in this process: measured, not assumed.

Keeping records in the page cache (``_pagetier.py``) costs every read from storage a decision and, for most,
an eviction (a residency probe, now and then the store's lock, a ``posix_fadvise``: 20-40 us on a quiet
machine, 100-190 us a read under the digits job's memory pressure), and each record it keeps saves one read
from storage per epoch. So it pays where ``kept * read >= misses * work`` per epoch: a read from storage must
take at least ``misses / kept`` times the tier's work on it, ``kept`` being the records its room holds and
``misses`` the rest of those the store does not hold (``pays(misses_per_kept)``). Each process times its
reads from storage and the tier's work (running averages; until 32 of each are measured, it is taken to
pay). Measured on ``bench_fetch_bound``'s small_files case (8 KB records, storage at 200 MB/s, ~3.7 misses
per record the room holds): with the tier always on, ours took 1.23-1.56x torch's time per later epoch,
though it read 15% fewer bytes; with a fixed bar of 4 it turned itself off there and ran as before
(0.74-1.05x), but turned itself off on the digits job at L = D/2 + M too (reads 410-650 us, work 100-190 us:
~1.5 misses per kept record), which then read 44-46 MB of its 45 MB per later epoch.
"""

from __future__ import annotations

__all__ = ["TierCost"]

_FIRST = 32  # reads and works measured before the averages decide
_WEIGHT = 1 / 32  # of the latest in a running average


class TierCost:
    """Running averages of this process's reads from storage and of the tier's work on each."""

    def __init__(self) -> None:
        self.read_seconds = self.work_seconds = 0.0
        self.record_bytes = 0.0  # of the records read from storage, on average
        self.reads = self.works = 0

    def note_read(self, seconds: float, nbytes: int) -> None:
        """A read of ``nbytes`` that came from storage (it brought its pages in) took ``seconds``."""
        self.reads += 1
        self.read_seconds = _average(self.read_seconds, seconds, self.reads)
        self.record_bytes = _average(self.record_bytes, nbytes, self.reads)

    def note_work(self, seconds: float) -> None:
        """The tier's decision and eviction for one read took ``seconds``."""
        self.works += 1
        self.work_seconds = _average(self.work_seconds, seconds, self.works)

    def pays(self, misses_per_kept: float) -> bool:
        """Whether the tier pays here: a read takes at least ``misses_per_kept`` times its work, or too few
        were measured to tell."""
        measured = self.reads >= _FIRST and self.works >= _FIRST
        return not measured or self.read_seconds >= misses_per_kept * self.work_seconds


def _average(average: float, seconds: float, count: int) -> float:
    """The running average after its ``count``-th value: a plain mean at first, then weighted."""
    weight = max(_WEIGHT, 1 / count)
    return average + weight * (seconds - average)
