"""A transform in two stages, the first deterministic: what lets the cache hold a record *prepared*.

``prepare(raw)`` is the part of a record's preparation that gives the same output every epoch (the decode of a
JPEG); ``augment(prepared)`` the part that draws from the random modules (the crop and flip). A cache that
holds ``prepare``'s output skips it on every hit. ``identity`` names what the prepared output depends on: two
transforms with one identity may share prepared records, so it must change with any setting of ``prepare``.

The built-in ``"train"`` and ``"eval"`` transforms are staged (``loader.fetching.decode``); a user's transform
is staged by subclassing :class:`StagedTransform` or wrapping two callables in :class:`Staged`. A plain
callable stays one stage: the cache holds its raw bytes only, since nothing says it is deterministic.

A prepared record is stored as bytes: arrays and tensors (and tuples, lists and dicts of them, with ints,
floats, strings and bytes beside) in a small typed layout written here, so that nothing read back from the
store is unpickled.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.lib.format import descr_to_dtype, dtype_to_descr

__all__ = ["Staged", "StagedTransform", "decode_prepared", "encode_prepared", "is_staged"]

_ALIGN = 64  # where a record's first array starts (JSON allows the header's trailing spaces)


class StagedTransform:
    """Base of a two-stage transform: ``self(raw) == self.augment(self.prepare(raw))`` for the same random
    state. Subclasses define ``prepare``, ``augment`` and ``identity``."""

    identity: str = ""

    def prepare(self, raw: bytes) -> Any:
        raise NotImplementedError

    def augment(self, prepared: Any) -> Any:
        raise NotImplementedError

    def __call__(self, raw: bytes) -> Any:
        return self.augment(self.prepare(raw))

    def prepare_augment(self, raw: bytes) -> tuple[Any, Any]:
        """``(self.prepare(raw), self.augment(<it>))``, the random draws as ``augment`` makes them: what a
        miss stores and what it gives. A subclass may override it where ``augment`` can start from a form
        ``prepare`` had before its output (the built-in train transform crops the decoded image, not its
        array); the sample must be the same."""
        prepared = self.prepare(raw)
        return prepared, self.augment(prepared)


@dataclass(frozen=True)
class Staged(StagedTransform):
    """A user's transform from two callables: ``prepare`` (deterministic) then ``augment``. ``identity``
    defaults to the two functions' qualified names; give your own where ``prepare`` has settings."""

    prepare_fn: Callable[[bytes], Any]
    augment_fn: Callable[[Any], Any]
    identity: str = ""

    def __post_init__(self) -> None:
        if not callable(self.prepare_fn) or not callable(self.augment_fn):
            raise TypeError("Staged needs two callables: prepare_fn(raw) and augment_fn(prepared)")
        if not self.identity:
            names = (_qualified(self.prepare_fn), _qualified(self.augment_fn))
            object.__setattr__(self, "identity", "Staged:" + "|".join(names))

    def prepare(self, raw: bytes) -> Any:
        return self.prepare_fn(raw)

    def augment(self, prepared: Any) -> Any:
        return self.augment_fn(prepared)


def is_staged(transform: Any) -> bool:
    """Whether ``transform`` says which part of it is deterministic."""
    return isinstance(transform, StagedTransform) and bool(transform.identity)


def encode_prepared(value: Any) -> bytearray:
    """``value`` as bytes: a JSON header (the tree, each array's dtype, shape and place), then the arrays'
    bytes, each copied once, straight into place. Raises TypeError naming what cannot be stored."""
    arrays: list[np.ndarray] = []
    tree = _encode(value, arrays)
    header = json.dumps(tree, separators=(",", ":")).encode()
    header += b" " * (-(4 + len(header)) % _ALIGN)  # the first array on a boundary: viewed, not copied
    start = 4 + len(header)
    out = bytearray(start + sum(a.nbytes for a in arrays))
    out[:start] = len(header).to_bytes(4, "little") + header
    flat = np.frombuffer(out, np.uint8)
    for array in arrays:
        flat[start : start + array.nbytes] = array.reshape(-1).view(np.uint8)
        start += array.nbytes
    return out


def decode_prepared(raw: bytes | bytearray | memoryview | np.ndarray, *, own: bool = False) -> Any:
    """What ``encode_prepared`` wrote. Every array is writable and no one else's: a fresh copy, or with
    ``own=True`` (``raw``, writable bytes handed over by its caller: a bytearray, an array of bytes) a view of
    ``raw`` itself, copied nowhere (an array not aligned there for its type is still copied). Raises
    ValueError when the bytes do not hold such a value."""
    view = memoryview(raw)
    if own and view.readonly:
        raise ValueError(f"own=True takes writable bytes, got a read-only {type(raw).__name__}")
    try:
        size = int.from_bytes(view[:4], "little")
        tree = json.loads(bytes(view[4 : 4 + size]))
        return _Reader(view, 4 + size, own).read(tree)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"not a prepared record ({exc})") from exc


def _encode(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, torch.Tensor):
        return {"t": "tensor", "a": _array(value.detach().cpu().numpy(), arrays)}
    if isinstance(value, np.ndarray):
        return {"t": "ndarray", "a": _array(value, arrays)}
    if isinstance(value, (tuple, list)):
        return {"t": type(value).__name__, "v": [_encode(v, arrays) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"t": "dict", "v": {k: _encode(v, arrays) for k, v in value.items()}}
    if isinstance(value, bytes):
        return {"t": "bytes", "a": _array(np.frombuffer(value, np.uint8), arrays)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"t": "plain", "v": value}
    raise TypeError(
        f"a prepared record cannot hold a {type(value).__name__}: prepare must return arrays, "
        "tensors, or tuples, lists and dicts of them"
    )


def _array(array: np.ndarray, arrays: list[np.ndarray]) -> dict:
    if array.dtype.hasobject:
        raise TypeError("a prepared record cannot hold an array of Python objects")
    arrays.append(np.ascontiguousarray(array))
    return {"d": dtype_to_descr(array.dtype), "s": list(array.shape), "n": array.nbytes}  # fields named


class _Reader:
    def __init__(self, view: memoryview, offset: int, own: bool) -> None:
        self.view, self.offset, self.own = view, offset, own

    def read(self, tree: dict) -> Any:
        kind = tree["t"]
        if kind == "plain":
            return tree["v"]
        if kind in ("tuple", "list"):
            items = [self.read(v) for v in tree["v"]]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict":
            return {k: self.read(v) for k, v in tree["v"].items()}
        array = self._array(tree["a"])
        if kind == "tensor":
            return torch.from_numpy(array)
        return array.tobytes() if kind == "bytes" else array

    def _array(self, spec: dict) -> np.ndarray:
        start, end = self.offset, self.offset + int(spec["n"])
        if end > len(self.view):
            raise ValueError("the record is shorter than its header says")
        self.offset = end
        dtype = descr_to_dtype(spec["d"])
        array = np.frombuffer(self.view[start:end], dtype) if self.own else None
        if array is None or not array.flags.aligned:
            array = np.frombuffer(bytearray(self.view[start:end]), dtype)
        return array.reshape(spec["s"])


def _qualified(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
