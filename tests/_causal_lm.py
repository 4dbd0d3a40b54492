"""A small causal transformer to check packing against: learned positions read from ``position_ids``, and
attention three ways: causal over the whole row (one example, or right-padded ones), through a boolean
``attn_mask`` (the packed block mask, for SDPA), or one example at a time between ``cu_seqlens`` (what
``flash_attn_varlen_func(..., causal=True)`` computes, done on the CPU). Also used by
benchmarks/bench_packing.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loader.packing import IGNORE_INDEX


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """Causal attention within each example of a packed row: (1, heads, T, dim) in and out. Split, not
    sliced: a slice's gradient is a zero tensor of the whole row, a split's gradients are joined once."""
    lengths = torch.diff(cu_seqlens).tolist()
    parts = zip(q.split(lengths, 2), k.split(lengths, 2), v.split(lengths, 2), strict=True)
    return torch.cat([F.scaled_dot_product_attention(*qkv, is_causal=True) for qkv in parts], dim=2)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None
    ) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if cu_seqlens is not None:
            y = varlen_attention(q, k, v, cu_seqlens)
        elif attn_mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.norm2(x))


class CausalLM(nn.Module):
    def __init__(self, vocab: int, *, dim: int = 32, heads: int = 2, layers: int = 2, positions: int = 512):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (batch, T, vocab). Neither mask nor ``cu_seqlens``: causal over the whole row."""
        x = self.embed(input_ids) + self.position(position_ids)
        for block in self.blocks:
            x = block(x, attn_mask, cu_seqlens)
        return self.head(self.norm(x))


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each position's loss at predicting the next label (0 where that label is ignored): (batch, T - 1)."""
    shifted = labels[:, 1:]
    flat = F.cross_entropy(
        logits[:, :-1].flatten(0, 1), shifted.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return flat.view(shifted.shape)
