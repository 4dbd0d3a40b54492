"""What the cache makes of the memory view (``memory.py``): the reserve it leaves free for the job's own
growth, the size ``cache_bytes="auto"`` gives it, and a gauge that says, cheaply and often, whether memory
is short now."""

from __future__ import annotations

from time import monotonic

from loader.system import memory as _memory
from loader.system.memory import MemoryView, format_bytes

__all__ = ["PressureGauge", "auto_cache_bytes", "reserve_bytes", "reserve_for_limit"]

_MIB = 1 << 20


def reserve_bytes(view: MemoryView) -> int:
    """Memory to leave free for the job's own growth: 5% of the limit, at least 128 MiB.

    The growth is mostly copy-on-write: a DataLoader worker shares its parent's pages when forked and copies
    each one it writes to (a refcount is a write), so a job's charged memory keeps growing through its first
    epoch. Measured: 2 workers of a 168 MB parent grew the job by 61 MB after the cache stopped admitting at
    64 MiB free, and the kernel killed it; 128 MiB covers that."""
    return reserve_for_limit(view.limit)


def reserve_for_limit(limit: int) -> int:
    """What the cache leaves free under a memory limit of ``limit`` bytes (``reserve_bytes``)."""
    return max(128 * _MIB, limit * 5 // 100)


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

    Bytes noted (the ``adding`` of each call that was not short) count as taken until the next read, so a
    burst of admissions between two reads cannot overrun the reserve. ``bytes_between`` defaults to an
    eighth of the reserve.
    """

    def __init__(self, interval: float = 0.05, bytes_between: int | None = None) -> None:
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        if bytes_between is not None and (isinstance(bytes_between, bool) or bytes_between <= 0):
            raise ValueError(f"bytes_between must be a positive int or None, got {bytes_between!r}")
        self.interval = interval
        self.bytes_between = bytes_between
        self.last: MemoryView | None = None
        self._read_at = 0.0
        self._noted = 0
        self._reserve = 0

    def short(self, adding: int = 0) -> bool:
        """Whether taking ``adding`` more bytes would leave less than the reserve free."""
        view = self.last
        if view is None or self._due(adding):
            view = self._read()
        is_short = view.headroom - self._noted - adding < self._reserve
        if not is_short:
            self._noted += adding
        return is_short

    def _due(self, adding: int) -> bool:
        between = self.bytes_between if self.bytes_between is not None else self._reserve // 8
        return self._noted + adding >= between or monotonic() - self._read_at >= self.interval

    def _read(self) -> MemoryView:
        self.last = view = _memory.memory_view()  # through the module: tests point it at fixtures
        self._read_at, self._noted, self._reserve = monotonic(), 0, reserve_bytes(view)
        return view
