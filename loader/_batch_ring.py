"""Large batch tensors handed from the workers to the main process through slots kept for the iterator's life.

In a worker, torch's ``default_collate`` stacks each tensor into a fresh shared-memory segment, which the main
process maps and frees once the batch is gone: for 64 images of 3x224x224 (9.6 MB) the kernel allocates and
zeroes 2,350 pages for every batch, ~5.7 ms in the worker alone against 0.4 ms for the same stack into
reused private memory (measured here). Where a prepared record costs a few microseconds, that is most of
an epoch: a prepared `"eval"` loader spent 240-440 us of CPU per image with the batches sent, 66-107 us
without. So a loader made with torch's ``default_collate`` and forked workers keeps ``prefetch_factor + 2``
slots per worker in one anonymous shared mapping (no file in /dev/shm: it goes with the last process that
maps it), made before the workers fork. A worker stacks each tensor of at least ``MIN_TENSOR_BYTES`` into
a free slot of its own (the same ``torch.stack`` as ``default_collate``, into other memory); the tensor
pickles as its place in the slot, and the main process, unpickling the batch, copies it out into a tensor
of its own and frees the slot. The batch the loop gets is the same value, in private memory (torch's is in
shared memory: ``is_shared()`` tells them apart). Where no slot is free or the tensor does not fit,
the worker stacks as ``default_collate`` does. Written by hand: torch's loader has no such path.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import mmap
import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map

__all__ = ["MIN_TENSOR_BYTES", "BatchRing", "RingCollate"]

MIN_TENSOR_BYTES = 4 << 20  # smaller tensors: a saving under ~2 ms a batch, while the slots' pages stay held
SLOTS_BEYOND_PREFETCH = 2  # the batch the loop holds, and the one before it that autograd may still hold
SLOT_BYTES = 256 << 20  # address space only: a slot's pages are taken as they are first written
_MAP_NORESERVE = 0x4000  # Linux; Python's mmap module does not name it
_ALIGN = 64
_rings: dict[int, BatchRing] = {}  # the main process's rings by number, for the tensors it unpickles
_numbers = itertools.count()


class BatchRing:
    """Shared slots, ``slots_per_worker`` for each of ``workers``: a flag each (0: free), then their data."""

    def __init__(self, workers: int, slots_per_worker: int) -> None:
        self.slots_per_worker = slots_per_worker
        count = workers * slots_per_worker
        self._head = mmap.PAGESIZE
        self._map = mmap.mmap(-1, self._head + count * SLOT_BYTES, flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        self._flags = np.frombuffer(self._map, np.int32, count)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._held: dict[int, int] = {}  # main process: tensors viewing each slot
        self._lock = threading.Lock()  # the main thread and the pin-memory thread both unpickle
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
        flat = torch.from_numpy(np.asarray(hold))
        return flat.view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype)

    def _let_go(self, slot: int) -> None:
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


def _handed(number: int, slot: int, offset: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    return _rings[number].handed(slot, offset, dtype, shape)


class _Hold:
    """Bytes of a slot, as numpy takes them (``__array_interface__``): the array, and every tensor made from
    it, keeps this alive, and the slot is let go when it dies."""

    def __init__(self, ring: BatchRing, slot: int, address: int, nbytes: int) -> None:
        self.ring, self.slot = ring, slot
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False)}

    def __del__(self) -> None:
        self.ring._let_go(self.slot)


class _Stacking:
    """One batch's stacking in a worker: the slot it took (if any) and the tensors it put there."""

    def __init__(self, ring: BatchRing, worker: int) -> None:
        self.ring, self.worker = ring, worker
        self.slot: int | None = None
        self.used = 0
        self.placed: list[_InSlot] = []

    def stack(self, batch: list[torch.Tensor]) -> torch.Tensor:
        elem = batch[0]
        shape = (len(batch), *elem.shape)
        nbytes = elem.element_size() * elem.numel() * len(batch)
        if (
            nbytes < MIN_TENSOR_BYTES
            or elem.layout != torch.strided
            or elem.is_nested
            or elem.device.type != "cpu"
        ):
            return collate_tensor_fn(batch)
        if self.slot is None:
            self.slot = self.ring.take(self.worker)
        if self.slot is None or self.used + nbytes > SLOT_BYTES:
            return collate_tensor_fn(batch)
        out = self.ring.view(self.slot, self.used, nbytes).view(elem.dtype).view(shape)
        torch.stack(batch, 0, out=out)
        placed = _InSlot(self, self.slot, self.used, elem.dtype, shape)
        self.placed.append(placed)
        self.used += -(-nbytes // _ALIGN) * _ALIGN
        return out.as_subclass(_RingTensor)._placed(placed)

    def done(self) -> None:
        if self.slot is not None and not self.placed:
            self.ring.release(self.slot)


class _InSlot:
    __slots__ = ("dtype", "offset", "shape", "slot", "stacking")

    def __init__(self, stacking: _Stacking, slot: int, offset: int, dtype: torch.dtype, shape: tuple) -> None:
        self.stacking, self.slot, self.offset, self.dtype, self.shape = stacking, slot, offset, dtype, shape


class _RingTensor(torch.Tensor):
    """A batch tensor stacked into a slot: pickled as its place there."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def _placed(self, placed: _InSlot) -> _RingTensor:
        self._in_slot = placed
        return self

    def __reduce_ex__(self, protocol: int) -> tuple[Any, ...]:
        p = self._in_slot
        return _handed, (p.stacking.ring.number, p.slot, p.offset, p.dtype, p.shape)


class RingCollate:
    """``default_collate`` in a worker, stacking large tensors into ``ring``'s slots; as is elsewhere."""

    def __init__(self, ring: BatchRing) -> None:
        self.ring = ring

    def __call__(self, samples: Any) -> Any:
        info = get_worker_info()
        if info is None:
            return default_collate(samples)
        stacking = _Stacking(self.ring, info.id)
        fns: dict[Any, Callable] = {**default_collate_fn_map}
        fns[torch.Tensor] = lambda batch, *, collate_fn_map: stacking.stack(batch)
        try:
            return collate(samples, collate_fn_map=fns)
        finally:
            stacking.done()


def ring_collate(loader: Any) -> tuple[BatchRing, Any] | None:
    """A ring for ``loader``'s workers and its ``collate_fn`` with torch's ``default_collate`` (itself, or
    inside our timed collate) stacking into it; None where the workers are not forked or the collate is
    the user's own."""
    from loader.collate import TimedCollate

    context = loader.multiprocessing_context
    method = context.get_start_method() if context is not None else multiprocessing.get_start_method()
    collate_fn = loader.collate_fn
    inner = collate_fn.collate_fn if isinstance(collate_fn, TimedCollate) else collate_fn
    if method != "fork" or inner is not default_collate:
        return None
    ring = BatchRing(loader.num_workers, (loader.prefetch_factor or 2) + SLOTS_BEYOND_PREFETCH)
    stacking = RingCollate(ring)
    if isinstance(collate_fn, TimedCollate):
        return ring, TimedCollate(stacking, collate_fn.board, collate_fn.batched)
    return ring, stacking
