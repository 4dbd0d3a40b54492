"""The node-local minimal-miss (MinIO) store: admit records until full, never evict.

Every epoch of a random-order job touches every record once, so the records to keep are any ``capacity``
of them, kept forever: each later epoch then hits exactly ``capacity / dataset`` of its reads, which is the
best any policy can do (see docs/concepts/minio-cache.md). The one exception is memory: the kernel cannot
reclaim the store, so where the job grows into the memory the cache keeps free, the store gives back the
records it admitted last (``_giveback.py``) rather than have the job killed. The store itself, where it lives
and how each process attaches to it, is ``_store.py``'s. Nothing read back is trusted: every record is
bounds-checked and checksummed before it is served.
"""

from __future__ import annotations

import errno
import os
import struct
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from loader.cache._giveback import GivesBack
from loader.cache._layout import EMPTY, HEADER_BYTES, READY, RESERVED, SLOT_DTYPE, UNHIT, checksum
from loader.cache._store import LOCK_TIMEOUT, CacheInfo, store_path
from loader.system.locks import LockTimeout, writer_alive, writer_id

__all__ = [
    "LOCK_TIMEOUT",
    "Admission",
    "TAKES_AHEAD",
    "CacheInfo",
    "CorruptRecordError",
    "MinIOCache",
    "store_path",
]

_SLOT_HEAD = struct.Struct("<QIIQ")  # offset, length, state, checksum: the head of a slot, read in one call
_SLOT_SIZE = SLOT_DTYPE.itemsize
TAKES_AHEAD = 16  # records of room the store must have to say it takes one: see MinIOCache.takes
_IOV_MAX = max(16, os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 16)  # -1: unknown
_NO_SPACE = (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT, errno.EFBIG)  # a write the store has no room for
_FIRST_HIT_WAIT = 0.002  # seconds a hit waits for the lock to mark its record served (held for microseconds)


class Admission(NamedTuple):
    """A record offered to the store (``MinIOCache.admit``'s arguments)."""

    index: int
    payload: bytes
    evict_on_hit: bool = False
    identity: int = 0


class CorruptRecordError(ValueError):
    """A cached record failed its bounds or checksum check; it is not served."""


class MinIOCache(GivesBack):
    """The minimal-miss policy over a shared store: safe for many processes to read and fill at once."""

    @property
    def memory_pauses(self) -> int:
        """Times this process paused admission because memory was short."""
        return self._gate.memory_pauses

    @property
    def used(self) -> int:
        """Bytes of records the store holds now (its data; the index not counted)."""
        return int(self._used[0])

    def get(
        self, index: int, identity: Callable[[int], int] | None = None, *, mutable: bool = False
    ) -> bytes | bytearray | np.ndarray | None:
        """The cached bytes of record ``index`` (writable, the caller's own, with ``mutable``: a bytearray, or
        an array of bytes from a disk), or None when the store does not hold it, or holds it under another
        ``identity(index)`` than the source gives now (asked once per record in each process: a file
        rewritten since it was admitted). Raises CorruptRecordError when the slot points outside the data or
        the bytes fail their checksum."""
        if self._gate.off:
            return None
        if overdrawn := self._gate.overdrawn(self._used):
            self._gate.note_given_back(*self.give_back(overdrawn))
        if not 0 <= index < self._num_records:
            raise IndexError(f"record index {index} out of range for a cache of {self._num_records} records")
        offset, length, state, expected = _SLOT_HEAD.unpack_from(self._map, HEADER_BYTES + _SLOT_SIZE * index)
        if state != READY and state != UNHIT:
            return None
        if identity is not None and not self.same_identity(index, identity):
            return None
        if offset + length > self._data_bytes:
            raise CorruptRecordError(f"slot {index} of {self.path} points past the end of its data")
        if self.in_memory and offset + length > os.fstat(self._data_fd).st_size:  # a SIGBUS, copied
            raise CorruptRecordError(f"record {index} in {self.path} lies past the end of its data file")
        raw = self._payload(offset, length, mutable)  # on a disk, a short read: refused below
        if len(raw) != length or checksum(index, raw) != expected:
            raise CorruptRecordError(f"record {index} in {self.path} fails its checksum")
        return raw

    def same_identity(self, index: int, identity: Callable[[int], int]) -> bool:
        """Whether the source says of record ``index`` (``identity(index)``) what it said when the record was
        admitted; a record found the same is not asked about again in this process (its reader, or its
        admitter asking once the read is over, so that a file changed during the read is never marked)."""
        if self._verified is not None and self._verified[index]:
            return True
        same = self.held_as(index, identity(index))
        if same:
            self._verified_now(index)
        return same

    def _verified_now(self, index: int) -> None:
        if self._verified is None:
            self._verified = bytearray(self._num_records)
        self._verified[index] = 1

    def held_as(self, index: int, identity: int) -> bool:
        """Whether record ``index`` was admitted with ``identity`` (held or not); False where the store is
        turned off in this process (one that could not be attached holds nothing)."""
        return not self._gate.off and int(self._identity[index]) == identity

    def accepting(self, index: int) -> bool:
        """Whether ``admit(index, ...)`` may store the record now: the store has room (or a dead writer's
        slot for it) and admission is not paused. Cheap: read before a miss is read from the source."""
        if not self._gate.open():
            return False
        full = self._full_here or self._full[0]
        return not full or self._state[index] == RESERVED  # a dead writer's slot is reused even when full

    def takes(self, index: int, nbytes: int, held: int = 0) -> bool:
        """Whether ``admit`` will store record ``index`` of ``nbytes`` now: the store, and memory, have room
        for ``TAKES_AHEAD`` such records. Asked before a miss is read around the page cache
        (``system.direct``), which leaves the record in neither cache if the store turns it down after all;
        the store's readers (read-ahead threads, workers, jobs) ask and admit at once, so room for one is
        not enough: the last records that fill the store, or the memory, are read through the page cache,
        as before. (Asking for room for one record, a loader's read-ahead threads, asking as the store
        filled, left a record in neither cache: ``test_dataloader_storage``.) ``held``: bytes the asker has
        read and holds for admission still (``CachedFiles.hold_admissions``), which need that room first."""
        ahead = TAKES_AHEAD * nbytes + held
        fits = int(self._used[0]) + ahead <= int(self._limit[0])
        return fits and self.accepting(index) and self._gate.room_for(ahead, self._used)

    def admit(self, index: int, payload: bytes, evict_on_hit: bool = False, identity: int = 0) -> bool:
        """Store record ``index`` if there is room and memory to spare; True when this call admitted it.
        ``evict_on_hit``: the read of ``payload`` left pages of its own in the page cache, to be evicted
        once the store has shown it keeps the record (``first_hit``). ``identity``: what the source said of
        the record before it was read (``Source.identity``), which ``get`` checks before serving it.

        The store's pages cannot be reclaimed by the kernel, so when the job's memory (its cgroup's, or the
        machine's) runs within a reserve of its limit, admission pauses, with one warning per process.
        """
        return self.admit_many([Admission(index, payload, evict_on_hit, identity)])[0]

    def admit_many(self, records: Sequence[Admission]) -> list[bool]:
        """``admit`` for each of ``records`` in order, with one hold of the lock for them all and one
        ``pwritev`` for each run of them whose space lies together: what a batch read without workers admits
        at its end (``FileReads.one_batch``: 5 us a file in the digits job, against 11 admitting each as it
        was read). Memory is asked for each as ``admit`` asks (the gauge counts those before it as taken): the
        first that would leave memory under its reserve pauses admission, and neither it nor any after it is
        admitted."""
        admitted = [False] * len(records)
        wanted = []
        for k, record in enumerate(records):
            if self.accepting(record.index):
                if self._gate.memory_short(len(record.payload), self._used):
                    break
                wanted.append(k)
        if not wanted:
            return admitted
        try:
            offsets = self._reserve_all([records[k] for k in wanted])
            placed = [(k, at) for k, at in zip(wanted, offsets, strict=True) if at is not None]
            written = self._write_all([(records[k].payload, at) for k, at in placed])
        except LockTimeout as exc:
            self._gate.pause_after_timeout(exc, self._mutex.timeout)
            return admitted
        except OSError as exc:  # the store was removed, replaced or cannot be written: read on from storage
            self._gate.turn_off(exc)
            return admitted
        for k in written:
            record = records[placed[k][0]]
            self._checksum[record.index] = checksum(record.index, record.payload)
            self._identity[record.index] = record.identity
            self._state[record.index] = UNHIT if record.evict_on_hit else READY  # one aligned 4-byte store
            admitted[placed[k][0]] = True
        return admitted

    def first_hit(self, index: int) -> bool:
        """Whether record ``index``, just read from the store, was read from it for the first time since an
        ``admit(..., evict_on_hit=True)``: the caller evicts the admitting read's pages now. Until then they
        stay, so a record given back before anyone read it again is still in the page cache."""
        if self._state[index] != UNHIT:
            return False
        try:
            with self._mutex.held(_FIRST_HIT_WAIT):  # not over a give_back's EMPTY
                if self._state[index] != UNHIT:
                    return False
                self._state[index] = READY
        except (LockTimeout, OSError):  # the lock is busy (a stopped process holds it?): at a later hit
            return False
        return True

    def set_limit(self, limit: int) -> int:
        """Let the store hold ``limit`` bytes of records from now on, no fewer than it holds (a store never
        evicts) and no more than its data file; returns the limit set. A store that hits its limit stops
        admitting, for every process; one given room again admits again. Raises LockTimeout where another
        process holds the store's lock past its timeout (one stopped, say): the limit is then unchanged."""
        with self._mutex.held():
            used = int(self._used[0])
            self._limit[0] = set_to = max(used, min(limit, self._data_capacity))
            self._full[0] = set_to <= used
        return set_to

    def _reserve_all(self, records: Sequence[Admission]) -> list[int | None]:
        """Space for each record's payload, marked as this process's, in one hold of the lock; None where
        none is had. A record held under another identity (its file rewritten since) gets new space: the
        old bytes stay where they are, unused, until the store is made anew."""
        me = writer_id(self.path)
        with self._mutex.held():
            return [self._reserve_held(r.index, len(r.payload), r.identity, me) for r in records]

    def _reserve_held(self, index: int, length: int, identity: int, me: tuple[int, int]) -> int | None:
        state = self._state[index]
        if state == RESERVED and self._reclaimable(index, length):
            self._writer[index], self._generation[index] = me  # a dead writer's: space reused
            return int(self._offset[index])
        stale = state in (READY, UNHIT) and int(self._identity[index]) != identity
        if self._full[0] or (state != EMPTY and not stale):
            return None
        used = int(self._used[0])
        if used + length > self._limit[0]:
            self._full[0] = 1
            return None
        self._used[0] = used + length  # space first: a writer killed now only wastes it
        self._offset[index], self._length[index] = used, length
        self._writer[index], self._generation[index] = me
        self._state[index] = RESERVED
        return used

    def _reclaimable(self, index: int, length: int) -> bool:
        """A RESERVED slot left by a writer that died mid-insert, sized for this record."""
        fits = int(self._length[index]) == length and int(self._offset[index]) + length <= self._data_bytes
        writer = (int(self._writer[index]), int(self._generation[index]))
        return fits and not writer_alive(self.path, writer)

    def _write_all(self, pieces: Sequence[tuple[bytes, int]]) -> list[int]:
        """Write each (payload, offset) of ``pieces``, one ``pwritev`` for each run of them that lies
        together; the positions in ``pieces`` of those written whole. A store out of space (its disk, or
        the tmpfs) stops admitting, for every process, with a warning."""
        whole: list[int] = []
        for first, run in _runs(pieces):
            offset = pieces[first][1]
            try:
                written = os.pwritev(self._data_fd, [payload for payload, _ in run], offset)
            except OSError as exc:
                if exc.errno not in _NO_SPACE:
                    raise
                written = 0
            for k, (payload, at) in enumerate(run, first):
                if at + len(payload) <= offset + written:
                    whole.append(k)
            if written < sum(len(payload) for payload, _ in run):
                self._out_of_space()
                break
        return whole

    def _out_of_space(self) -> None:
        self._full_here = True
        self._full[0] = 1
        warnings.warn(
            f"no space left for the cache at {self.path}: it stops admitting records at "
            f"{int(self._used[0])} bytes; training goes on reading from storage",
            RuntimeWarning,
            stacklevel=4,
        )


def _runs(pieces: Sequence[tuple[bytes, int]]) -> Iterator[tuple[int, Sequence[tuple[bytes, int]]]]:
    """(position of the first, the run) for each run of ``pieces`` that lie end to end, of at most
    ``_IOV_MAX`` (what one ``pwritev`` takes)."""
    first = 0
    for k in range(1, len(pieces) + 1):
        if k == len(pieces) or k - first == _IOV_MAX or pieces[k][1] != _end(pieces[k - 1]):
            yield first, pieces[first:k]
            first = k


def _end(piece: tuple[bytes, int]) -> int:
    payload, offset = piece
    return offset + len(payload)
