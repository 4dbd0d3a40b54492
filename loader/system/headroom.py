"""Whether memory is short now (stop admitting) or overdrawn (give records back): a gauge over the memory view
(``memory.py``), read cheaply and often while the job runs, that keeps the reserve ``sizing.py`` sets free
for the job's own growth."""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

from loader.system import memory as _memory
from loader.system.memory import MemoryView
from loader.system.sizing import reserve_for_limit

__all__ = ["PressureGauge"]

_MIB = 1 << 20
_LAST_MARGIN = 16 * _MIB  # see PressureGauge.overdrawn
# ext4 attaches a buffer head (104 bytes on 64-bit Linux, its slab's object size) to each 4 KiB block written
# through the page cache: measured, 131,119 more in /proc/slabinfo for a 512 MiB file written (13.6 MB)
_BUFFER_HEAD_SHARE = 104 / 4096


class PressureGauge:
    """Tells whether memory is short; reads the memory view at most every ``interval`` seconds or after
    ``bytes_between`` bytes were noted, whichever comes first.

    What the cache may still take (``spare``) is the headroom less what the job's own memory has been above
    its present use at its peak (the job is the usage the kernel cannot reclaim less ``held``, the bytes the
    cache holds): a job's memory swings by tens of MB within a batch (read buffers, a worker's copies), and a
    cache admitted in a trough would meet the next peak. Bytes noted (the ``adding`` of each call that was
    not short) count as taken until the next read, so a burst of admissions between two reads cannot
    overrun the reserve. What it keeps free (``reserve``) is ``reserve_for_limit`` of the limit and the
    job's own memory at its peak. ``bytes_between`` defaults to an eighth of the reserve.

    ``held_in_memory``: the cache's pages are memory the kernel cannot reclaim (a store in a tmpfs), so the
    view's usage counts them; else (a store on a disk, ``system.home``) they are page cache, which the view
    counts as headroom, and the cache's own bytes are taken from the headroom instead. Either way what the
    cache may still take is the limit less the job's own peak and what the cache holds.

    A store on a disk also costs kernel memory: the buffer heads ext4 attaches to the pages it wrote (2.5% of
    them), which the cgroup is charged for and the view counts as the job's; the kernel frees them with the
    page, so they are not the job's own. Up to that share of what the cache holds, and never more than the
    kernel memory the view reports, is taken off the job's own memory. Counted as the job's, they lowered
    the fetch-bound benchmark's store by ~26 MB of a 1 GB half (8,889 of 9,000 records; torch/ours 1.37-1.39
    in its last epoch where every record held gives 1.41). Where the filesystem attaches none (XFS, btrfs),
    up to that share of the job's other kernel memory is taken for them: what the store may then take more
    is page cache, which the kernel reclaims before it kills.
    """

    def __init__(
        self, interval: float = 0.05, bytes_between: int | None = None, *, held_in_memory: bool = True
    ) -> None:
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        if bytes_between is not None and (isinstance(bytes_between, bool) or bytes_between <= 0):
            raise ValueError(f"bytes_between must be a positive int or None, got {bytes_between!r}")
        self.interval = interval
        self.bytes_between = bytes_between
        self.held_in_memory = held_in_memory
        self.last: MemoryView | None = None
        self.held = 0  # the bytes the cache held at the last read
        self.beside = 0  # the memory free beside the cache at the last read (the job's peak not kept)
        self.spare = 0
        self.read_at = 0.0
        self._noted = 0
        self.reserve = 0  # what to keep free, as of the last read
        self.own = 0  # the job's own memory at the last read
        self.own_peak = 0
        self._peak_source = ""

    def short(self, adding: int = 0, held: Callable[[], int] = lambda: 0, *, note: bool = True) -> bool:
        """Whether taking ``adding`` more bytes would leave less than the reserve spare; where not, the bytes
        count as taken (``note=False``: a question only, nothing taken)."""
        if self.last is None or self._due(adding):
            self._read(held())
        is_short = self.spare - self._noted - adding < self.reserve
        if not is_short and note:
            self._noted += adding
        return is_short

    def overdrawn(self, held: Callable[[], int] = lambda: 0) -> int:
        """Bytes to give back now: where the job came within 16 MiB of its limit (or half the reserve, where
        that is less; its memory read when due), what brings the spare memory back to twice that; else 0.

        Between that margin and the reserve the store neither admits nor gives back: the reserve is for
        growth not seen yet, and a job that grew into it (an evaluation loader's workers forked) most often
        stays there. Records given back after they were served are lost to the page cache too (their pages
        were evicted at their first hit), so giving back early costs reads. Measured on a 288 MiB job under a
        407 MiB limit, when records were evicted at admission: giving back at half the reserve dropped all
        42 MB the store held when the evaluation workers forked, and epoch 2 read 47.5 MB of the 51 MB
        dataset (torch's loader 0.0 MB, its page cache holding it all); giving back within 16 MiB only, the
        store kept 25 MB and epoch 2 read 18 MB, epoch 3 1-8 MB.

        Within the reserve the memory is read five times as often (every 10 ms by default, ~44 us a read):
        sampled every 10 ms, that job's unreclaimable memory swung by 10-12 MiB from one batch to the next
        once its evaluation workers ran, and a look every 50 ms found it within 1 MiB of its limit."""
        within_reserve = self.spare - self._noted < self.reserve
        interval = self.interval / 5 if within_reserve else self.interval
        if self.last is None or monotonic() - self.read_at >= interval:
            self._read(held())
        spare = self.spare - self._noted
        least = self._last_margin()
        return 0 if spare >= least else 2 * least - spare

    def shortfall(self, held: Callable[[], int] = lambda: 0, growth: int = 0) -> int:
        """Bytes to give back so that the reserve is free, memory read now: before the job grows at once, by
        ``growth`` bytes where that is known (workers about to fork, ``forkgrowth``), and then so that the
        grown job stays clear of the margin at which ``overdrawn`` gives back."""
        self._read(held())
        room = growth + self._last_margin() if growth else 0
        return max(0, max(self.reserve, room) - self.spare)

    def _last_margin(self) -> int:
        """Free memory under which the store gives back: 16 MiB, or half the reserve where that is less."""
        return min(self.reserve // 2, _LAST_MARGIN)

    def _due(self, adding: int) -> bool:
        between = self.bytes_between if self.bytes_between is not None else self.reserve // 8
        return self._noted + adding >= between or monotonic() - self.read_at >= self.interval

    def forget(self) -> None:
        """Read the memory again at the next question (after the store gave memory back). ``last`` stays:
        another read-ahead thread of the process may be warning with it now."""
        self.read_at = float("-inf")

    def _read(self, held: int) -> None:
        view = _memory.memory_view()  # through the module: tests point it at fixtures
        if view.source != self._peak_source:
            self.own_peak, self._peak_source = 0, view.source  # another limit binds: another usage
        own = view.limit - view.headroom - (held if self.held_in_memory else _buffer_heads(held, view))
        self.own, self.own_peak = own, max(self.own_peak, own)
        self.last, self.held, self.spare = view, held, view.limit - self.own_peak - held
        self.beside = view.limit - own - held  # free now: what a page cache beside the cache may use
        self.read_at, self._noted = monotonic(), 0
        self.reserve = reserve_for_limit(view.limit, self.own_peak)


def _buffer_heads(held: int, view: MemoryView) -> int:
    """The kernel memory a disk store's ``held`` bytes may have attached (``PressureGauge`` says why)."""
    return min(view.kernel, int(held * _BUFFER_HEAD_SHARE))
