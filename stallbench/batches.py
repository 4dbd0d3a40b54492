"""What a batch holds, counted one way by the compute model, the measuring of every job and the reports.

Two shapes of token batch are known, so their useful work can be told from their padding:

* padded, as ``stallbench.jobs.batching.pad_tokens`` makes it: ``(ids [B, L], lengths [B])``; its token slots
  are ``B * L``, its valid tokens ``lengths.sum()``;
* packed, as ``loader.packing.PackingCollator`` makes it: a mapping with ``input_ids`` (1, T) and
  ``cu_seqlens``; every position holds a token of an example (the collator's default, ``pad_to_max=False``).
  Its token slots are the room it was packed into (``room``: the collator's ``max_len``), so the room a
  pack leaves empty counts as padding; without ``room``, its tokens.

Any other batch has samples but no token counts: its useful work is not guessed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

__all__ = ["TokenCount", "batch_samples", "batch_tokens"]


class TokenCount(NamedTuple):
    """Tokens of real examples, and the token slots the batch carried (what a model computes on)."""

    valid: int
    slots: int


def _padded(batch: Any) -> bool:
    if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
        return False
    ids, lengths = batch
    return (
        isinstance(ids, torch.Tensor)
        and ids.dim() == 2
        and isinstance(lengths, torch.Tensor)
        and (lengths.dim() == 1 and len(lengths) == len(ids) and not lengths.is_floating_point())
    )


def _packed(batch: Any) -> bool:
    return isinstance(batch, Mapping) and "input_ids" in batch and "cu_seqlens" in batch


def batch_tokens(batch: Any, room: int | None = None) -> TokenCount | None:
    """The valid tokens and token slots of a padded or packed token batch (packed into ``room`` tokens);
    None for any other batch."""
    if _padded(batch):
        return TokenCount(int(batch[1].sum()), batch[0].numel())
    if _packed(batch):
        tokens = batch["input_ids"].numel()
        return TokenCount(tokens, max(tokens, room or 0))
    return None


def batch_samples(batch: Any) -> int:
    """Examples in the batch: a pack's examples, else the first dimension of the first tensor found
    depth-first (an ``(inputs, labels)`` pair's, a mapping's first field's), else 1."""
    if _packed(batch):
        return len(batch["cu_seqlens"]) - 1
    found = _first_tensor(batch, depth=0)
    return int(found.shape[0]) if found is not None and found.dim() > 0 else 1


def _first_tensor(value: Any, depth: int) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if depth > 16 or isinstance(value, (str, bytes)):
        return None
    if isinstance(value, Mapping):
        children: Any = value.values()
    elif isinstance(value, (list, tuple)):
        children = value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        children = (getattr(value, f.name) for f in dataclasses.fields(value))
    else:
        return None
    for child in children:
        found = _first_tensor(child, depth + 1)
        if found is not None:
            return found
    return None
