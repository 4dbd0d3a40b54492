"""Whether keeping records in the page cache pays in this process: measured, not assumed.

Keeping records in the page cache (``_pagetier.py``) costs each read from storage a decision and, for most, an
eviction (a residency probe, now and then the store's lock, a ``posix_fadvise``: some 20-40 us), and it buys
hits from memory for a share of the later reads. Where a read from storage takes about as long (small records
from fast storage), it costs more than it saves. Measured on ``bench_fetch_bound``'s small_files case (8 KB
records, storage at 200 MB/s): with the tier ours took 1.23-1.56x torch's time per later epoch, though it read
15% fewer bytes; without it 0.74-1.05x. On the digits job of ``bench_tight_budget`` (3.6 KB records, 5 MB/s:
reads of ~0.7 ms) it cut the time to the target by 3-16%. So each process times its reads from storage and the
tier's work on them, and keeps to the tier while a read takes at least 4 times that work (running averages;
the first 32 of each are taken to pay).
"""

from __future__ import annotations

__all__ = ["TierCost"]

_PAYS = 4  # a read from storage at least this many times the tier's work on it
_FIRST = 32  # reads and works measured before the averages decide
_WEIGHT = 1 / 32  # of the latest in a running average


class TierCost:
    """Running averages of this process's reads from storage and of the tier's work on each."""

    def __init__(self) -> None:
        self.read_seconds = self.work_seconds = 0.0
        self.reads = self.works = 0

    def note_read(self, seconds: float) -> None:
        """A read that came from storage (it brought its pages in) took ``seconds``."""
        self.reads += 1
        self.read_seconds = _average(self.read_seconds, seconds, self.reads)

    def note_work(self, seconds: float) -> None:
        """The tier's decision and eviction for one read took ``seconds``."""
        self.works += 1
        self.work_seconds = _average(self.work_seconds, seconds, self.works)

    def pays(self) -> bool:
        """Whether the tier pays here: a read takes at least 4 times its work, or too few were measured."""
        measured = self.reads >= _FIRST and self.works >= _FIRST
        return not measured or self.read_seconds >= _PAYS * self.work_seconds


def _average(average: float, seconds: float, count: int) -> float:
    """The running average after its ``count``-th value: a plain mean at first, then weighted."""
    weight = max(_WEIGHT, 1 / count)
    return average + weight * (seconds - average)
