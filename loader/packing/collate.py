"""The collator: one pack of examples in, what a boundary-aware model needs out.

The keys follow Hugging Face's ``DataCollatorWithFlattening`` (``input_ids``, ``position_ids``, ``labels``,
leading batch dimension 1), so a model that takes those takes ours; ``cu_seqlens`` / ``max_seqlen`` are what
``flash_attn_varlen_func`` takes, and ``attention_mask`` is the block-diagonal causal mask for
``scaled_dot_product_attention``. Without the boundaries a packed example would attend to, and learn to
predict, its neighbours: the quality loss of early packing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["IGNORE_INDEX", "PackingCollator", "block_causal_mask"]

IGNORE_INDEX = -100  # the label cross_entropy ignores by default


class PackingCollator:
    """``collate_fn`` for a DataLoader whose batches are packs (``PackedBatchSampler``).

    An example is a 1-D integer tensor or array of token ids, a mapping with ``"input_ids"`` (and, if its
    loss is masked, ``"labels"``), or the ``(tokens, label)`` pair ``loader.ArrowDataset`` gives. Returns:

    * ``input_ids`` (1, T) int64: the examples one after the other;
    * ``position_ids`` (1, T) int64: 0, 1, ... restarting at each example;
    * ``labels`` (1, T) int64: the example's labels (its tokens by default) with -100 at its first position,
      so that with the usual shift no token learns to predict the next example's first;
    * ``cu_seqlens`` (n + 1,) int32: 0, then where each example ends; ``max_seqlen`` int: the longest;
    * ``attention_mask`` (1, 1, T, T) bool, if ``block_mask``: True where a query may attend a key (same
      example, not later); ``(T, T)`` memory, so turn it off when attention uses ``cu_seqlens``;
    * ``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``max_length_q`` / ``max_length_k``, if ``flash_attn_names``:
      the same values under the names Hugging Face models take.

    ``pad_to_max`` fills the pack to ``max_len`` (one shape every step) with a last segment of ``pad_id``
    tokens, all labelled -100, which ``cu_seqlens`` and the mask treat as one more example.
    """

    def __init__(
        self,
        max_len: int,
        *,
        pad_to_max: bool = False,
        pad_id: int = 0,
        block_mask: bool = True,
        flash_attn_names: bool = False,
    ) -> None:
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be a positive number of tokens, got {max_len!r}")
        self.max_len, self.pad_to_max, self.pad_id = max_len, pad_to_max, pad_id
        self.block_mask, self.flash_attn_names = block_mask, flash_attn_names

    def __call__(self, examples: Sequence[Any]) -> dict[str, Any]:
        if not examples:
            raise ValueError("a pack needs at least one example")
        ids, labels = zip(*(_tokens_and_labels(e, k) for k, e in enumerate(examples)), strict=True)
        ids, labels = list(ids), list(labels)
        total = sum(len(t) for t in ids)
        if total > self.max_len:
            raise ValueError(
                f"a pack of {len(ids)} examples holds {total} tokens, more than max_len={self.max_len}: "
                "were the packs made with another max_len?"
            )
        if self.pad_to_max and total < self.max_len:
            ids.append(torch.full((self.max_len - total,), self.pad_id, dtype=torch.int64))
            labels.append(torch.full((self.max_len - total,), IGNORE_INDEX, dtype=torch.int64))
        return self._batch(ids, [ids[k] if got is None else got for k, got in enumerate(labels)])

    def _batch(self, ids: list[torch.Tensor], labels: list[torch.Tensor]) -> dict[str, Any]:
        lengths = torch.tensor([len(t) for t in ids])
        cu_seqlens = torch.zeros(len(ids) + 1, dtype=torch.int32)
        cu_seqlens[1:] = torch.cumsum(lengths, 0)
        starts = cu_seqlens[:-1].long()
        positions = torch.arange(int(cu_seqlens[-1])) - torch.repeat_interleave(starts, lengths)
        targets = torch.cat(labels)  # a new tensor: the examples' own are left as they are
        targets[starts] = IGNORE_INDEX
        longest = int(lengths.max())
        batch: dict[str, Any] = {
            "input_ids": torch.cat(ids)[None],
            "position_ids": positions[None],
            "labels": targets[None],
            "cu_seqlens": cu_seqlens,
            "max_seqlen": longest,
        }
        if self.block_mask:
            batch["attention_mask"] = block_causal_mask(cu_seqlens)
        if self.flash_attn_names:
            batch.update(cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens)
            batch.update(max_length_q=longest, max_length_k=longest)
        return batch


def block_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """(1, 1, T, T) bool, True where query ``t`` may attend key ``s``: the same example and ``s <= t``.

    The ``attn_mask`` of ``scaled_dot_product_attention`` (True: take part in attention).
    """
    lengths = torch.diff(cu_seqlens.long())
    example = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    total = len(example)
    causal = torch.ones(total, total, dtype=torch.bool).tril_()
    return (causal & (example[:, None] == example[None, :]))[None, None]


def _tokens_and_labels(example: Any, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Example ``k`` of the pack as int64 token ids, and its labels where it has its own."""
    labels = None
    if isinstance(example, Mapping):
        tokens, labels = example["input_ids"], example.get("labels")
    elif isinstance(example, tuple) and example and isinstance(example[0], torch.Tensor | np.ndarray):
        tokens = example[0]  # (tokens, label): what loader's datasets give
    else:
        tokens = example
    tokens = _int64_vector(tokens, f"example {k} of the pack")
    if labels is not None:
        labels = _int64_vector(labels, f"the labels of example {k} of the pack")
        if labels.shape != tokens.shape:
            raise ValueError(f"example {k} of the pack has {len(tokens)} tokens but {len(labels)} labels")
    return tokens, labels


def _int64_vector(values: Any, what: str) -> torch.Tensor:
    tensor = torch.as_tensor(values)
    integers = not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)
    if tensor.ndim != 1 or len(tensor) == 0 or not integers:
        shape = tuple(tensor.shape)
        raise ValueError(f"{what} must be a non-empty 1-D sequence of integers, got {tensor.dtype} {shape}")
    return tensor.to(torch.int64)
