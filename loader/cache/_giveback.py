"""How a store lives with the job's memory: in a tmpfs, where the job grows into the memory the cache keeps
free, it gives memory back (the records it admitted last go, their pages punched out of the data file,
admitted again later if memory allows; the store never evicts otherwise, ``minio.py``); on a disk the
kernel takes its pages back instead (``AdmissionGate.gives_back``), and where the records it misses would
crowd its own pages out of the page cache, it says so (``crowded``)."""

from __future__ import annotations

import numpy as np

from loader.cache._layout import EMPTY, READY, RESERVED
from loader.cache._store import SharedStore
from loader.system.libc import punch_hole
from loader.system.locks import LockTimeout

__all__ = ["GivesBack"]


class GivesBack(SharedStore):
    """A shared store that frees memory from its tail on demand, and says when it is crowded (``MinIOCache``
    is one)."""

    def crowded(self) -> bool:
        """Whether the records this store misses should be read around the page cache: it is on a disk, and
        the memory free beside it now (``PressureGauge.beside``) holds neither those records nor as much as
        the store. The page cache would then fill with them and push the store's own pages
        out, each read again from the disk at its hit: measured, 2,000 records of 112 KiB held and 2,000
        missed under a 300 MiB limit read 1.07-1.45x the misses' bytes in the epochs after the first with
        the misses in the page cache, 1.00x around it. Where that memory holds the misses, or the store is
        the smaller stake, its misses go through the page cache, as torch's loader reads them."""
        return not (self.in_memory or self._gate.off) and self._gate.crowded(self._used, self._missing_bytes)

    def _missing_bytes(self) -> int:
        """The bytes of the records the store does not hold, at its records' mean size."""
        held = int(np.count_nonzero(self._state >= READY))
        return (self._num_records - held) * (int(self._used[0]) // max(1, held))

    def give_back(self, nbytes: int) -> tuple[int, int]:
        """Free about ``nbytes`` of memory: the records admitted last are dropped (slots EMPTY, admitted
        again later if memory allows) and their pages punched out of the data file. A record being written
        is kept, with what lies below it. Returns the bytes freed and the records dropped, which the header
        counts, with the job's own memory and its limit as this process's gate last saw them.

        A reader that looked a dropped slot up just before reads zeros or another record's bytes: its
        checksum fails and the record is read from the source (``CorruptRecordError``), never served wrong.
        """
        own, limit = self._gate.pressure()
        try:
            with self._mutex.held():
                used = int(self._used[0])
                cut = self._tail_cut(max(0, used - nbytes))
                dropped = (self._state >= READY) & (self._offset >= cut)
                self._state[dropped] = EMPTY
                self._used[0], self._full[0] = cut, 0
                punch_hole(self._data_fd, cut, used)
                if used > cut:
                    self._note_give_back(used - cut, int(dropped.sum()), own, limit)
        except (LockTimeout, OSError):  # another process gives back, or the store is gone: no harm done
            return 0, 0
        return used - cut, int(dropped.sum())

    def make_room(self, growth: int = 0) -> int:
        """Give back what keeps the reserve, or room for ``growth`` bytes, from being free (``_attached``)."""
        nbytes = self._gate.shortfall(self._used, growth) if self._data_fd is not None else 0
        freed, records = self.give_back(nbytes) if nbytes else (0, 0)
        if freed:
            self._gate.note_given_back(freed, records)
        return freed

    def _note_give_back(self, nbytes: int, records: int, own: int, limit: int) -> None:
        """Count a give-back in the header (under the store's lock)."""
        header = self._header
        header["given_back"] += nbytes
        header["records_given_back"] += records
        header["own_at_give_back"], header["limit_at_give_back"] = own, limit

    def _tail_cut(self, target: int) -> int:
        """Where the data may end once no more than ``target`` bytes are kept: at or above ``target`` past
        any record still being written (RESERVED), down to the start of a record that straddles it."""
        ends = self._offset + self._length
        writing = (self._state == RESERVED) & (ends > target)
        cut = max(target, int(ends[writing].max())) if writing.any() else target
        straddles = (self._state >= READY) & (self._offset < cut) & (ends > cut)
        return int(self._offset[straddles].min()) if straddles.any() else cut
