"""Boundary-aware sequence packing: several examples per row of ``max_len`` tokens, none seeing another.

``pack(lengths, max_len, algorithm)`` makes the packs (lists of example indices); ``PackedBatchSampler``
hands a DataLoader one pack per step, in a random order per epoch, resumable mid-epoch; ``PackingCollator``
turns a pack's examples into ``input_ids``, ``position_ids``, ``labels``, ``cu_seqlens``, ``max_seqlen`` and
a block-diagonal causal ``attention_mask``; ``packing_report`` says how much padding packing removes.
See docs/how-to/text-packing.md.
"""

from loader.packing.algorithms import ALGORITHMS, Algorithm, pack
from loader.packing.collate import IGNORE_INDEX, PackingCollator, block_causal_mask
from loader.packing.report import PackingReport, packing_report
from loader.packing.sampler import PackedBatchSampler

__all__ = [
    "ALGORITHMS",
    "IGNORE_INDEX",
    "Algorithm",
    "PackedBatchSampler",
    "PackingCollator",
    "PackingReport",
    "block_causal_mask",
    "pack",
    "packing_report",
]
