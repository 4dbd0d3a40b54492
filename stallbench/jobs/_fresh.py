"""A batch's fresh copy: every tensor in it cloned, the containers around them rebuilt with their own types.

The ingestion runs hand out copies of batches already made (``_replay`` in a user's command, the generated
job's ingestion loader): a step that edits its batch in place must not change the batches handed out later,
and a copy a worker sends through shared memory is freed by the step as a real batch is.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["fresh_copy"]


def fresh_copy(batch: Any) -> Any:
    """``batch`` with every tensor cloned, through lists, tuples, namedtuples, mappings and dataclasses (each
    keeping its type); any other value as it is."""
    import torch

    return _copy(batch, torch.Tensor)


def _copy(value: Any, tensor: type) -> Any:
    if isinstance(value, tensor):
        return value.clone()
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, tuple):
        items = [_copy(v, tensor) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else _retyped(value, items, tuple)
    if isinstance(value, list):
        return _retyped(value, [_copy(v, tensor) for v in value], list)
    if isinstance(value, MutableMapping):
        new = copy.copy(value)  # keeps an OrderedDict's or defaultdict's type and settings
        for key, item in value.items():
            new[key] = _copy(item, tensor)
        return new
    if isinstance(value, Mapping):
        return {key: _copy(item, tensor) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        new = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(new, f.name, _copy(getattr(value, f.name), tensor))
        return new
    return value


def _retyped(value: Any, items: list[Any], plain: type) -> Any:
    try:
        return items if type(value) is list else type(value)(items)
    except Exception:
        return plain(items)
