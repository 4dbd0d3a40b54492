"""A batch's fresh copy: every tensor in it cloned, the containers around them rebuilt with their own types.

The ingestion run hands out copies of batches already made (``_replay``): a step that edits its batch in
place must not change the batches handed out later. Where the loader has workers, a real batch reaches the
step in shared memory, and freeing it there (an unmap, ~0.2 ms for 19 MB) is part of every step of the
other runs; so the copies are made in shared memory too (``shared``), or that cost would move from compute to
stall.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["fresh_copy"]


def fresh_copy(batch: Any, shared: bool = False) -> Any:
    """``batch`` with every tensor cloned (into shared memory with ``shared``, a CPU tensor's), through lists,
    tuples, namedtuples, mappings and dataclasses (each keeping its type); any other value as it is."""
    import torch

    def clone(t: torch.Tensor) -> torch.Tensor:
        copied = t.clone()
        return copied.share_memory_() if shared and copied.device.type == "cpu" else copied

    return _copy(batch, torch.Tensor, clone)


def _copy(value: Any, tensor: type, clone: Any) -> Any:
    if isinstance(value, tensor):
        return clone(value)
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, tuple):
        items = [_copy(v, tensor, clone) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else _retyped(value, items, tuple)
    if isinstance(value, list):
        return _retyped(value, [_copy(v, tensor, clone) for v in value], list)
    if isinstance(value, MutableMapping):
        new = copy.copy(value)  # keeps an OrderedDict's or defaultdict's type and settings
        for key, item in value.items():
            new[key] = _copy(item, tensor, clone)
        return new
    if isinstance(value, Mapping):
        return {key: _copy(item, tensor, clone) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        new = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(new, f.name, _copy(getattr(value, f.name), tensor, clone))
        return new
    return value


def _retyped(value: Any, items: list[Any], plain: type) -> Any:
    try:
        return items if type(value) is list else type(value)(items)
    except Exception:
        return plain(items)
