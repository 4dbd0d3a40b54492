"""Large batch tensors handed from the workers to the main process through slots kept for the iterator's life.

In a worker, torch's ``default_collate`` stacks each tensor into a fresh shared-memory segment, which the main
process maps and frees once the batch is gone: for 64 images of 3x224x224 (9.6 MB) the kernel allocates and
zeroes 2,350 pages for every batch, ~5.7 ms in the worker alone against 0.4 ms for the same stack into
reused memory (measured here). Where a prepared record costs microseconds, that is most of an epoch: a
prepared ``"eval"`` loader spent 240-440 us of CPU per image with its batches sent, 66-107 us without.

So a loader made with torch's ``default_collate`` and forked workers keeps ``prefetch_factor + 2`` slots per
worker in one anonymous shared mapping, ``BatchRing``, made before the workers fork (no file in /dev/shm: it
goes with the last process that maps it). A worker stacks each large tensor into a free slot of its own
(``loader/transport/ring_collate.py``), and the tensor pickles as its place there; the main process,
unpickling the batch, makes a tensor that views the slot (``handed``), and the slot is free again once no
tensor views it (the batch and every view of it are gone). A slot's pages are written again and again, never
allocated anew. The loop gets the same values as from torch's loader; its tensors are not in torch's shared
memory (``is_shared()`` is False): a batch sent on to another process is copied there, as any tensor is.
Written by hand: torch's loader has no such path.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import mmap
import os
import threading

import numpy as np
import torch

__all__ = ["SLOT_BYTES", "BatchRing", "handed"]

SLOT_BYTES = 64 << 20  # address space only: a slot's pages are taken as they are first written
_MAP_NORESERVE = 0x4000  # Linux; Python's mmap module does not name it
_rings: dict[int, BatchRing] = {}  # the main process's rings by number, for the tensors it unpickles
_numbers = itertools.count()


class BatchRing:
    """Shared slots, ``slots_per_worker`` for each of ``workers``: a flag each (0: free), then their data."""

    def __init__(self, workers: int, slots_per_worker: int) -> None:
        self.slots_per_worker = slots_per_worker
        count = workers * slots_per_worker
        self._head = -(-count * 4 // mmap.PAGESIZE) * mmap.PAGESIZE  # the flags, in whole pages
        self._map = mmap.mmap(-1, self._head + count * SLOT_BYTES, flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        self._flags = np.frombuffer(self._map, np.int32, count)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._held: dict[int, int] = {}  # main process: tensors viewing each slot
        # the main and pin-memory threads unpickle; on Python 3.12+ a collection may free a slot inside it
        self._lock = threading.RLock()
        self._pid = os.getpid()  # the process whose tensors view the slots: the one to free them
        self.number = next(_numbers)
        _rings[self.number] = self

    def take(self, worker: int) -> int | None:
        """A free slot of ``worker``'s (now marked in use), or None."""
        first = worker * self.slots_per_worker
        for slot in range(first, first + self.slots_per_worker):
            if self._flags[slot] == 0:
                self._flags[slot] = 1
                return slot
        return None

    def release(self, slot: int) -> None:
        self._flags[slot] = 0

    def view(self, slot: int, offset: int, nbytes: int) -> torch.Tensor:
        """The bytes ``[offset, offset + nbytes)`` of ``slot`` as a uint8 tensor over the mapping."""
        start = self._head + slot * SLOT_BYTES + offset
        return torch.frombuffer(self._map, dtype=torch.uint8, count=nbytes, offset=start)

    def handed(self, slot: int, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """In the main process: the tensor a worker stacked there, viewing the slot; the slot is freed once
        no tensor views it any more."""
        nbytes = dtype.itemsize * math.prod(shape)
        with self._lock:
            self._held[slot] = self._held.get(slot, 0) + 1
        hold = _Hold(self, slot, self._base + self._head + slot * SLOT_BYTES + offset, nbytes)
        return torch.from_numpy(np.asarray(hold)).view(dtype).view(shape)

    def _let_go(self, slot: int) -> None:
        if os.getpid() != self._pid:  # a forked child's copy of a batch: the slot is the parent's to free
            return
        with self._lock:
            left = self._held[slot] - 1
            if left:
                self._held[slot] = left
                return
            del self._held[slot]
        self.release(slot)

    def close(self) -> None:
        """Forget the ring (its iterator is gone); the mapping goes with the last process holding it."""
        _rings.pop(self.number, None)


def handed(number: int, slot: int, offset: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """A slot's tensor, as the main process unpickles it (``loader.transport.ring_collate``'s tensors pickle
    as this call)."""
    ring = _rings.get(number)
    if ring is None:  # only while a finished iterator's pin-memory thread winds down
        raise RuntimeError("a batch arrived after its DataLoader iterator was finished")
    return ring.handed(slot, offset, dtype, shape)


class _Hold:
    """Bytes of a slot, as numpy takes them (``__array_interface__``): the array, and every tensor made from
    it, keeps this alive, and the slot is let go when it dies."""

    def __init__(self, ring: BatchRing, slot: int, address: int, nbytes: int) -> None:
        self.ring, self.slot = ring, slot
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False)}

    def __del__(self) -> None:
        self.ring._let_go(self.slot)
