"""Torch's ``default_collate`` in a forked worker, stacking each large tensor into a slot of the loader's
``BatchRing`` (``loader/transport/batch_ring.py`` says why) rather than into fresh shared memory; the tensor
pickles as its place in the slot. Where no slot is free or a tensor does not fit, it stacks as
``default_collate`` does.

A small tensor (labels, a few floats a sample) goes by value, its bytes in the message that carries the batch:
torch's path makes a segment in /dev/shm for it and hands its descriptor over a socket of its own, which costs
more than copying a few kilobytes, and a worker killed between the segment's creation and its unlink (torch
unlinks it at once) leaves the name in /dev/shm for good. With both, a batch of ``default_collate`` from a
forked worker makes nothing in /dev/shm unless the ring is full.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map

from loader.transport.batch_ring import SLOT_BYTES, BatchRing, handed

__all__ = ["MIN_TENSOR_BYTES", "RingCollate", "ring_collate"]

MIN_TENSOR_BYTES = 256 << 10  # smaller tensors go by value: a copy through the pipe costs less than a segment
PIECE_MIN_BYTES = 16 << 10  # a piece's smaller tensors go by value: one short message
SLOTS_BEYOND_PREFETCH = 2  # the batch the loop holds, and the one before it that autograd may still hold
_ALIGN = 64


class _Stacking:
    """One batch's stacking in a worker: the slot it took (if any) and the tensors it put there; without a
    ring (``None``), tensors of ``min_bytes`` or more are stacked as torch's collate does."""

    def __init__(self, ring: BatchRing | None, worker: int, min_bytes: int) -> None:
        self.ring, self.worker, self.min_bytes = ring, worker, min_bytes
        self.slot: int | None = None
        self.used = 0  # bytes of the slot this batch's tensors take

    def stack(self, batch: list[torch.Tensor]) -> torch.Tensor:
        elem = batch[0]
        if not _plain(elem):
            return collate_tensor_fn(batch)
        shape = (len(batch), *elem.shape)
        nbytes = elem.element_size() * elem.numel() * len(batch)
        if nbytes < self.min_bytes:  # stacked into the first sample's dtype, as torch's collate does
            return by_value(torch.stack(batch, 0, out=torch.empty(shape, dtype=elem.dtype)))
        if self.ring is None:
            return collate_tensor_fn(batch)
        if self.slot is None:
            self.slot = self.ring.take(self.worker)
        if self.slot is None or self.used + nbytes > SLOT_BYTES:
            return collate_tensor_fn(batch)
        out = self.ring.view(self.slot, self.used, nbytes).view(elem.dtype).view(shape)
        torch.stack(batch, 0, out=out)
        place = (self.ring.number, self.slot, self.used, elem.dtype, shape)
        self.used += -(-nbytes // _ALIGN) * _ALIGN
        return out.as_subclass(_RingTensor)._placed(place)

    def done(self, sent: bool) -> None:
        """The batch is collated (``sent``: it goes to the main process) or failed: a slot it holds nothing
        of, or holds for a batch that is not sent, is free again."""
        if self.ring is not None and self.slot is not None and not (sent and self.used):
            self.ring.release(self.slot)


def _plain(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is one the ring or a copy by value can carry: a strided CPU tensor of torch's own
    class (a subclass keeps torch's path, as torch's stack keeps the subclass) that needs no gradient (torch's
    stack into shared memory raises for one in the worker, where the error reaches the loop; pickling it by
    value would fail later, in the queue's thread, and the batch would be lost)."""
    return (
        type(tensor) is torch.Tensor
        and tensor.layout == torch.strided
        and not tensor.is_nested
        and not tensor.is_quantized
        and not tensor.requires_grad
        and tensor.device.type == "cpu"
    )


def by_value(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, pickled as its bytes where it is small and plain; as it is otherwise."""
    if not _plain(tensor) or tensor.element_size() * tensor.numel() >= MIN_TENSOR_BYTES:
        return tensor
    return tensor.contiguous().as_subclass(_ValueTensor)


class _ValueTensor(torch.Tensor):
    """A small batch tensor: pickled as its bytes."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __reduce_ex__(self, protocol: int) -> tuple[Any, ...]:
        plain = self.as_subclass(torch.Tensor).resolve_conj().resolve_neg()
        data = plain.reshape(-1).view(torch.uint8).numpy().tobytes()
        return _from_bytes, (data, self.dtype, tuple(self.shape))


def _from_bytes(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor sent by value, as the main process unpickles it."""
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(np.frombuffer(data, np.uint8).copy()).view(dtype).view(shape)


class _RingTensor(torch.Tensor):
    """A batch tensor stacked into a slot: pickled as its place there."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def _placed(self, place: tuple[int, int, int, torch.dtype, tuple[int, ...]]) -> _RingTensor:
        self._place = place  # handed's arguments: the ring's number, the slot, the offset, dtype and shape
        return self

    def __reduce_ex__(self, protocol: int) -> tuple[Any, ...]:
        return handed, self._place


class RingCollate:
    """``default_collate`` in a worker, stacking tensors of ``min_bytes`` or more into ``ring``'s slots (with
    no ring, as torch's collate does) and smaller ones by value; as is elsewhere."""

    def __init__(self, ring: BatchRing | None, min_bytes: int = MIN_TENSOR_BYTES) -> None:
        self.ring, self.min_bytes = ring, min_bytes

    def __call__(self, samples: Any) -> Any:
        info = get_worker_info()
        if info is None or default_collate_fn_map.get(torch.Tensor) is not collate_tensor_fn:
            return default_collate(samples)  # not in a worker, or the user set torch's map's tensor entry
        stacking = _Stacking(self.ring, info.id, self.min_bytes)
        fns: dict[Any, Callable] = {kind: _sent_by_value(fn) for kind, fn in default_collate_fn_map.items()}
        fns[torch.Tensor] = lambda batch, *, collate_fn_map: stacking.stack(batch)
        try:
            batch = collate(samples, collate_fn_map=fns)
        except BaseException:
            stacking.done(sent=False)
            raise
        stacking.done(sent=True)
        return batch


def _sent_by_value(fn: Callable) -> Callable:
    """``fn`` of torch's map (numbers into a tensor, say), its tensor sent by value where small."""

    def collate_and_mark(batch: Any, *, collate_fn_map: dict) -> Any:
        made = fn(batch, collate_fn_map=collate_fn_map)
        return by_value(made) if type(made) is torch.Tensor else made

    return collate_and_mark


def ring_collate(loader: Any, pieces: int = 1) -> tuple[BatchRing, Any] | None:
    """A ring for ``loader``'s workers and its ``collate_fn`` with torch's ``default_collate`` (itself, or
    inside our timed collate) stacking into it; None where the workers are not forked or the collate is
    the user's own. ``pieces``: each batch is collated in that many pieces (``ready_first``), each its own
    slot, and tensors of ``PIECE_MIN_BYTES`` already go into the ring: a piece by value whose message
    outgrows the pipe's 64 kB waits on the main process to read it (a piece of 98 kB took ~3 reads)."""
    from loader.transport.collate import TimedCollate

    context = loader.multiprocessing_context
    if context is not None:
        method = context.get_start_method()
    else:  # not set yet: the platform's default, without setting it (asking the default context would)
        default = multiprocessing.get_all_start_methods()[0]
        method = multiprocessing.get_start_method(allow_none=True) or default
    collate_fn = loader.collate_fn
    inner = collate_fn.collate_fn if isinstance(collate_fn, TimedCollate) else collate_fn
    if method != "fork" or inner is not default_collate:
        return None
    try:
        ring = BatchRing(loader.num_workers, (loader.prefetch_factor or 2) * pieces + SLOTS_BEYOND_PREFETCH)
    except OSError:  # no address space for it (a strict overcommit, a ulimit): torch's path
        return None
    stacking = RingCollate(ring, MIN_TENSOR_BYTES if pieces == 1 else PIECE_MIN_BYTES)
    if isinstance(collate_fn, TimedCollate):
        return ring, TimedCollate(stacking, collate_fn.board, collate_fn.batched)
    return ring, stacking
