"""What the cache makes of the memory view (``memory.py``): the reserve it leaves free for the job's own
growth, the size ``cache_bytes="auto"`` gives it, and a gauge that says, cheaply and often, whether memory
is short now (stop admitting) or overdrawn (give records back)."""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

from loader.system import memory as _memory
from loader.system.memory import MemoryView, format_bytes

__all__ = ["PressureGauge", "auto_cache_bytes", "reserve_bytes", "reserve_for_limit"]

_MIB = 1 << 20
_RESERVE_FLOOR = 128 * _MIB  # see reserve_bytes


def reserve_bytes(view: MemoryView) -> int:
    """Memory to leave free for the job's own growth: 5% of the limit, at least 128 MiB.

    The growth is mostly copy-on-write: a DataLoader worker shares its parent's pages when forked and copies
    each one it writes to (a refcount is a write), so a job's charged memory keeps growing through its first
    epoch, and it grows at once, faster than any look at the memory, each time workers are forked (measured:
    2 workers of a 168 MB parent grew the job by 61 MB; a 362 MiB job that builds its evaluation loader after
    epoch 1 was killed with 32 MiB kept free, and its page cache, squeezed, read 82 MB per 45 MB epoch).
    What grows slowly past half of the reserve, the store gives back (``PressureGauge.overdrawn``)."""
    return reserve_for_limit(view.limit)


def reserve_for_limit(limit: int) -> int:
    """What the cache leaves free under a memory limit of ``limit`` bytes (``reserve_bytes``)."""
    return max(_RESERVE_FLOOR, limit * 5 // 100)


def auto_cache_bytes(wanted: int, view: MemoryView | None = None) -> tuple[int, str]:
    """Bytes to give the cache: ``wanted``, within the headroom less the reserve; and a sentence why."""
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
        raise ValueError(f"wanted must be a non-negative int, got {wanted!r}")
    view = _memory.memory_view() if view is None else view
    reserve = reserve_bytes(view)
    chosen = max(0, min(wanted, view.headroom - reserve))
    free = f"{format_bytes(view.headroom)} free per {view.source}"
    if chosen == wanted:
        return chosen, f"{format_bytes(chosen)}: the dataset's size, within {free}"
    return chosen, f"{format_bytes(chosen)}: {free}, less {format_bytes(reserve)} kept free"


class PressureGauge:
    """Tells whether memory is short; reads the memory view at most every ``interval`` seconds or after
    ``bytes_between`` bytes were noted, whichever comes first.

    What the cache may still take (``spare``) is the headroom less what the job's own memory has been above
    its present use at its peak (the job is the usage the kernel cannot reclaim less ``held``, the bytes the
    cache holds): a job's memory swings by tens of MB within a batch (read buffers, a worker's copies), and a
    cache admitted in a trough would meet the next peak. Bytes noted (the ``adding`` of each call that was
    not short) count as taken until the next read, so a burst of admissions between two reads cannot
    overrun the reserve. ``bytes_between`` defaults to an eighth of the reserve.
    """

    def __init__(self, interval: float = 0.05, bytes_between: int | None = None) -> None:
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        if bytes_between is not None and (isinstance(bytes_between, bool) or bytes_between <= 0):
            raise ValueError(f"bytes_between must be a positive int or None, got {bytes_between!r}")
        self.interval = interval
        self.bytes_between = bytes_between
        self.last: MemoryView | None = None
        self.spare = 0
        self._read_at = 0.0
        self._noted = 0
        self._reserve = 0
        self._own_peak = 0
        self._peak_source = ""

    def short(self, adding: int = 0, held: Callable[[], int] = lambda: 0) -> bool:
        """Whether taking ``adding`` more bytes would leave less than the reserve spare."""
        if self.last is None or self._due(adding):
            self._read(held())
        is_short = self.spare - self._noted - adding < self._reserve
        if not is_short:
            self._noted += adding
        return is_short

    def overdrawn(self, held: Callable[[], int] = lambda: 0) -> int:
        """Bytes to give back now: where the job grew into more than half of the reserve (its memory read
        when due), what brings the spare memory back to the reserve; else 0."""
        if self.last is None or monotonic() - self._read_at >= self.interval:
            self._read(held())
        spare = self.spare - self._noted
        return 0 if spare >= self._reserve // 2 else self._reserve - spare

    def _due(self, adding: int) -> bool:
        between = self.bytes_between if self.bytes_between is not None else self._reserve // 8
        return self._noted + adding >= between or monotonic() - self._read_at >= self.interval

    def forget(self) -> None:
        """Read the memory again at the next question (after the store gave memory back). ``last`` stays:
        another read-ahead thread of the process may be warning with it now."""
        self._read_at = float("-inf")

    def _read(self, held: int) -> None:
        view = _memory.memory_view()  # through the module: tests point it at fixtures
        if view.source != self._peak_source:
            self._own_peak, self._peak_source = 0, view.source  # another limit binds: another usage
        own = view.limit - view.headroom - held
        self._own_peak = max(self._own_peak, own)
        self.last, self.spare = view, view.headroom - (self._own_peak - own)
        self._read_at, self._noted, self._reserve = monotonic(), 0, reserve_bytes(view)
