"""Records kept in the page cache where memory is too short for the store: the minimal-miss rule in memory the
kernel can take back.

The store's pages cannot be reclaimed, so where memory is short it keeps a reserve free for the job's growth
and admits nothing more (``_admission.py``); the records it does not hold are read from storage every epoch.
Left to the kernel, their pages form an LRU over a reshuffled order, which hits far fewer than the bytes it
holds: a record read at a random point of one epoch and wanted at a random point of the next is still there
only if fewer than C bytes were read in between, about C**2 / (2 D**2) of the reads for a page cache of C
bytes over D, not C / D. (Measured on the digits job of ``bench_tight_budget`` at L = D/2 + M, torch's
loader: 41-50 MB read per later epoch of a 45 MB dataset. The same job evicting the pages of all but the
first 5,000 files right after each read: 27 MB, and 33 s to the target against 56 s.)

So where memory is short (the store would not admit), a record read from storage is kept in the page cache
while the records so kept leave 4 MiB of the spare memory (the gauge's: the headroom at the job's peak, in
which file pages count as free): marked PAGED in the store's index, for every process and job that shares
it. The
pages of any other record read are evicted once it is read, so they never push a kept record out. The
reserve the store leaves free is not wasted then, and the kernel takes those pages back, rather than kill,
where the job does grow into it. What the kernel leaves the tier is learned as it goes: a kept record found
cold (none of its pages resident: the kernel took them) is kept no longer, and the process keeps no more
than are kept then; each kept record found warm lets it keep one more (``PressureGauge.page_room``).
Pages another reader brought in are never evicted: only a read that brought every page in is ``ours``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import numpy as np

from loader.cache._layout import EMPTY, PAGED
from loader.cache._store import SharedStore
from loader.system.locks import LockTimeout
from loader.system.pagecache import PAGE

__all__ = ["PageTier", "page_bytes"]

_MARK_WAIT = 0.002  # seconds a read waits for the store's lock to mark its record (held for microseconds)


def page_bytes(nbytes: int | np.ndarray) -> int:
    """The bytes of whole pages that ``nbytes`` of a file take in the page cache (summed over an array)."""
    if isinstance(nbytes, int):
        return -(-nbytes // PAGE) * PAGE  # a read's: numpy would cost more than the rest of the decision
    return int(np.sum(-(-np.asarray(nbytes, np.int64) // PAGE) * PAGE))


class PageTier(SharedStore):
    """A shared store that also keeps, where memory is short, some records in the page cache (``admit`` is
    the store's policy's: ``MinIOCache``)."""

    @property
    def paged(self) -> int:
        """Bytes (whole pages) of the records kept in the page cache now, over every process."""
        return int(self._paged[0])

    def offer(
        self, index: int, payload: bytes, ours: bool, evict: Callable[[], None], seconds: float
    ) -> bool:
        """Offer record ``index``, read from its source in ``seconds``, to the store: True where admitted
        (``admit``). Where not, its pages stay in the page cache, or, where memory is short and they do not
        fit there (``keeps_pages``), ``evict()`` drops them now, while that pays (``tier_pays``); an eviction
        that fails is advisory, never an error."""
        if self.admit(index, payload, ours):
            return True
        if not ours:
            self.keeps_pages(index, len(payload), ours)  # a kept record found warm lets one more in
            return False
        cost = self._gate.tier_cost
        cost.note_read(seconds, len(payload))
        if not cost.pays(self._misses_per_kept()):
            return False
        start = time.perf_counter()
        if not self.keeps_pages(index, len(payload), ours):
            with contextlib.suppress(OSError, ValueError):  # the file is gone, or the record is bad
                evict()
        cost.note_work(time.perf_counter() - start)
        return False

    def tier_pays(self) -> bool:
        """Whether a read the store would not admit should still be probed and offered, for the page cache:
        memory is short for the store, and this process has not measured the tier to cost more than it saves
        (``_tiercost.py``). Otherwise such a read is a plain read, as it was before the tier."""
        gate = self._gate
        return not gate.off and gate.memory_tight(self._used) and gate.tier_cost.pays(self._misses_per_kept())

    def _misses_per_kept(self) -> float:
        """Per record the tier's room can keep, the records neither it nor the store holds (at least 1), from
        the average record read from storage."""
        record = max(1.0, self._gate.tier_cost.record_bytes)
        kept = max(1.0, self._gate.page_room(self._used) / page_bytes(int(record)))
        held = int(self._used[0]) / record
        return max(1.0, (self._num_records - held - kept) / kept)

    def keeps_pages(self, index: int, nbytes: int, ours: bool) -> bool:
        """Whether the pages that a read of record ``index`` (``nbytes``, not admitted to the store) left in
        the page cache should stay; ``ours``: the read brought every one of them in. A caller told False
        evicts them now."""
        pages = page_bytes(nbytes)
        if not ours:  # warm: pages another reader brought in, or a kept record's, still there
            if self._state[index] == PAGED:
                self._gate.kept_survived(pages)
            return True
        if self._state[index] == PAGED:  # kept, and found cold: the kernel took its pages back
            self._mark(index, PAGED, EMPTY, -pages)
            self._gate.kept_lost(self.paged)
            return False
        if self._gate.off or not self._gate.memory_tight(self._used):
            return True  # memory to spare: the kernel keeps what it can, as it would for torch's loader
        room = self._gate.page_room(self._used)
        if int(self._paged[0]) + pages > room:
            return False  # full: decided without the lock, as most reads are once it filled
        return self._mark(index, EMPTY, PAGED, pages, room)

    def _mark(self, index: int, was: int, now: int, pages: int, room: int | None = None) -> bool:
        """Move record ``index`` from state ``was`` to ``now``, counting ``pages`` more (or fewer) bytes kept,
        within ``room`` bytes kept in all (None: no bound); False where its state is no longer ``was``, there
        is no room, or the lock is busy (a stopped process holds it?)."""
        try:
            with self._mutex.held(_MARK_WAIT):
                fits = room is None or int(self._paged[0]) + pages <= room
                if self._state[index] != was or not fits:
                    return False
                self._state[index] = now
                self._paged[0] = max(0, int(self._paged[0]) + pages)
        except (LockTimeout, OSError):
            return False
        return True
