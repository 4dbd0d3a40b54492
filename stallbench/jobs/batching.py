"""How a generated job batches token sequences: padded (``batch_size`` sequences, padded to the longest) or
packed (``loader.packing``: packs of at most ``max_len`` tokens), and what it counts of them.

Packed and padded steps are compared at one budget: a packed step holds as many packs as fill the token
slots of a padded step (``packs_per_step``: the padded steps' mean slots over ``max_len``, at least one), so
both sides compute on as many token positions a step; the room a pack leaves short of ``max_len`` counts as
that step's padding.

The epoch's order is drawn in the job's main process, so the indices it hands out are counted there
(:class:`SeenIndices`): the unique examples of an epoch. A job in a group (``coordinate``) is not counted:
the group's first member draws the order for all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from stallbench.jobs.spec import WorkloadJob

__all__ = ["SeenIndices", "packs_per_step", "pad_tokens", "token_batching"]


class SeenIndices:
    """A sampler or batch sampler, unchanged, that remembers the distinct indices of its latest pass."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._seen: set[int] = set()

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        # a generator: a pass torch begins and drops unread does not reset the count
        self._seen = seen = set()
        for item in self.inner:
            seen.update(item if isinstance(item, list) else (item,))
            yield item

    @property
    def unique(self) -> int:
        """Distinct example indices handed out in the latest pass (so far)."""
        return len(self._seen)


def pad_tokens(batch: list[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences of different lengths -> (right-padded int64 [B, longest], lengths)."""
    lengths = torch.tensor([len(t) for t, _ in batch])
    padded = torch.zeros(len(batch), int(lengths.max()) if len(batch) else 0, dtype=torch.int64)
    for row, (tokens, _) in enumerate(batch):
        padded[row, : len(tokens)] = tokens
    return padded, lengths


def token_batching(lengths: np.ndarray, job: WorkloadJob, generator: torch.Generator) -> dict[str, Any]:
    """DataLoader options for the job's token batches: ``collate_fn`` and a ``batch_sampler`` that counts
    the indices it hands out (a :class:`SeenIndices`, except in a group)."""
    if job.packing is not None:
        from loader.packing import PackedBatchSampler, PackingCollator

        per_step = packs_per_step(lengths, job.batch_size, job.max_len, job.seed)
        packs = _Grouped(
            PackedBatchSampler(lengths, job.max_len, algorithm=job.packing, seed=job.seed), per_step
        )
        order: Any = packs
        collate: Any = PackingCollator(per_step * job.max_len, block_mask=False)  # attention takes cu_seqlens
    else:
        drawn = torch.utils.data.RandomSampler(range(len(lengths)), generator=generator)
        order, collate = torch.utils.data.BatchSampler(drawn, job.batch_size, drop_last=False), pad_tokens
    counted = SeenIndices(order) if job.coordinate is None else order
    return {"batch_sampler": counted, "collate_fn": collate}


def packs_per_step(lengths: np.ndarray, batch_size: int, max_len: int, seed: int = 0) -> int:
    """Packs of ``max_len`` that hold a padded step's token slots: ``batch_size`` examples of a random order,
    padded to the longest of them, on average over an epoch."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    batches = [lengths[order[i : i + batch_size]] for i in range(0, len(order), batch_size)]
    slots = np.mean([len(b) * int(b.max()) for b in batches]) if batches else max_len
    return max(1, round(float(slots) / max_len))


class _Grouped:
    """``per_step`` consecutive packs of ``packs`` as one step's indices (each pack's examples stay whole)."""

    def __init__(self, packs: Any, per_step: int) -> None:
        self.packs, self.per_step = packs, per_step

    def __len__(self) -> int:
        return -(-len(self.packs) // self.per_step)

    def __iter__(self) -> Iterator[list[int]]:
        step: list[int] = []
        for k, pack in enumerate(self.packs, 1):
            step.extend(pack)
            if k % self.per_step == 0:
                yield step
                step = []
        if step:
            yield step
