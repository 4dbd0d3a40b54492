"""Pieces of a batch, as ``ready_first`` moves them: collated in the workers where the loader's ``collate_fn``
is torch's ``default_collate`` (joined and cut in the main process along the batch's first dimension), else
handed on as the samples themselves (collated in the main process by the loader's own ``collate_fn``).

``default_collate`` makes a tensor of each tensor, number and array, keeps a mapping's keys and a
namedtuple's fields, turns a sequence of fields into a list of collated fields, and keeps strings as they came
(a list, or a tuple in a field of tuples): each has a first dimension of one row per sample, so a batch of
whole pieces is their join, and a piece larger than a batch's room is cut. Written by hand: torch has the
collate but not its inverse.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from loader.transport.ring_collate import RingCollate, by_value

__all__ = ["PieceSamples", "cut", "joined", "piece_collate", "rows", "samples_apart"]


def piece_collate(collate_fn: Any) -> Any | None:
    """The workers' ``collate_fn`` for collated pieces where ``collate_fn`` is ``default_collate`` (or wraps
    it, as the loader's timed collate does: ``collate.TimedCollate``) and no batch ring carries them (workers
    not forked); None where it is the user's own."""
    from loader.transport.collate import TimedCollate

    timed = isinstance(collate_fn, TimedCollate)
    if (collate_fn.collate_fn if timed else collate_fn) is not default_collate:
        return None
    piece = RingCollate(None)  # small tensors by value: a segment in /dev/shm each costs more than the copy
    return TimedCollate(piece, collate_fn.board, collate_fn.batched) if timed else piece


def samples_apart(collate_fn: Any) -> tuple[Any, Any]:
    """For the user's own ``collate_fn``: the workers' (the samples handed on, ``PieceSamples``, timed and
    counted into the loader's stats where the loader times its collate) and the main process's (the
    user's own)."""
    from loader.transport.collate import TimedCollate

    if isinstance(collate_fn, TimedCollate):
        return TimedCollate(PieceSamples(), collate_fn.board, collate_fn.batched), collate_fn.collate_fn
    return PieceSamples(), collate_fn


def rows(piece: Any) -> int:
    """How many samples a collated piece holds: the first dimension of its first leaf that has one."""
    found = _rows(piece)
    if found is None:
        raise ValueError(
            f"a collated piece of {type(piece).__name__} has no tensor or string to count rows by"
        )
    return found


def _rows(piece: Any) -> int | None:
    if isinstance(piece, torch.Tensor):
        return piece.shape[0] if piece.dim() else None
    if _strings(piece):
        return len(piece)
    parts = (
        piece.values() if isinstance(piece, Mapping) else piece if isinstance(piece, (list, tuple)) else ()
    )
    return next((n for n in map(_rows, parts) if n is not None), None)


def cut(piece: Any, start: int, stop: int) -> Any:
    """Samples ``start`` to ``stop`` of a collated piece (tensors as views)."""
    return _each(piece, lambda part: cut(part, start, stop), lambda leaf: leaf[start:stop])


def joined(pieces: Sequence[Any]) -> Any:
    """Collated pieces as one batch: their rows one after another."""
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0]
    if isinstance(first, torch.Tensor):
        return _rows_joined(pieces)
    if isinstance(first, Mapping):
        return _like(first, {key: joined([p[key] for p in pieces]) for key in first})
    if _strings(first):
        return type(first)(s for p in pieces for s in p)
    if any(len(p) != len(first) for p in pieces):
        raise RuntimeError("each element in list of batch should be of equal size")  # torch's words
    fields = [joined([p[i] for p in pieces]) for i in range(len(first))]
    return type(first)(*fields) if hasattr(first, "_fields") else type(first)(fields)


def _rows_joined(pieces: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(pieces)``, copied by one thread where each piece is a plain contiguous tensor of one
    dtype: torch's copy wakes its thread pool for a batch this size, and on cores the workers keep busy a
    woken thread comes late (a join of four 98 kB pieces took up to 44 ms)."""
    first = pieces[0]
    plain = all(
        type(p) is torch.Tensor
        and p.dtype == first.dtype
        and p.is_contiguous()
        and p.device.type == "cpu"
        and not p.requires_grad
        for p in pieces
    )
    if not plain or first.dim() == 0 or any(p.shape[1:] != first.shape[1:] for p in pieces):
        return torch.cat(pieces)
    flat = np.concatenate([p.reshape(-1).view(torch.uint8).numpy() for p in pieces])
    shape = (sum(p.shape[0] for p in pieces), *first.shape[1:])
    return torch.from_numpy(flat).view(first.dtype).view(shape)


def _each(piece: Any, inner: Callable[[Any], Any], leaf: Callable[[Any], Any]) -> Any:
    if isinstance(piece, torch.Tensor) or _strings(piece):
        return leaf(piece)
    if isinstance(piece, Mapping):
        return _like(piece, {key: inner(value) for key, value in piece.items()})
    fields = [inner(value) for value in piece]
    return type(piece)(*fields) if hasattr(piece, "_fields") else type(piece)(fields)


def _strings(piece: Any) -> bool:
    """Whether ``piece`` is collated strings: a list of them (a batch of strings), or a tuple (a field of a
    batch of tuples, as ``zip`` made it); an empty list is a field of no fields, not strings."""
    return type(piece) in (list, tuple) and bool(piece) and all(isinstance(s, (str, bytes)) for s in piece)


def _like(mapping: Mapping, values: dict) -> Any:
    """``values`` in a copy of ``mapping`` (its type and state: a ``defaultdict``'s factory), as
    ``default_collate`` keeps a mapping; a plain dict where it cannot be copied and updated."""
    try:
        like = copy.copy(mapping)
        like.update(values)  # type: ignore[attr-defined]
        return like
    except (TypeError, AttributeError):
        return values


class PieceSamples:
    """The workers' ``collate_fn`` where the loader's is the user's own: a piece's samples as they are, each
    plain tensor in them sent by value (the main process collates the batch they go into)."""

    def __call__(self, samples: list[Any]) -> list[Any]:
        return [_by_value(sample) for sample in samples]


def _by_value(item: Any) -> Any:
    if type(item) is torch.Tensor and not item.requires_grad:
        return by_value(item)
    if isinstance(item, Mapping):
        return _like(item, {key: _by_value(value) for key, value in item.items()})
    if isinstance(item, tuple) and hasattr(item, "_fields"):  # a namedtuple
        return type(item)(*(_by_value(value) for value in item))
    if type(item) in (list, tuple):
        return type(item)(_by_value(value) for value in item)
    return item
