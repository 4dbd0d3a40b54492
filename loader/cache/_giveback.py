"""How a store gives memory back where the job grows into the memory the cache keeps free: the records it
admitted last go, their pages punched out of the data file, and they are admitted again later if memory
allows. The store never evicts otherwise (``minio.py``)."""

from __future__ import annotations

from loader.cache._layout import EMPTY, READY, RESERVED
from loader.cache._store import SharedStore
from loader.system.libc import punch_hole
from loader.system.locks import LockTimeout

__all__ = ["GivesBack"]


class GivesBack(SharedStore):
    """A shared store that frees memory from its tail on demand (``MinIOCache`` is one)."""

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
