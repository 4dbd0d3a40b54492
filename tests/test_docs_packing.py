"""The examples of docs/how-to/text-packing.md run as written; flash-attention by a CPU stand-in that checks
the arguments as the kernel would."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from tests.test_docs import DOCS, python_blocks

GPU_LINE = 'device, dtype = "cuda", torch.bfloat16'


def flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
    """What the kernel computes, on the CPU, after the checks it makes of its arguments."""
    assert q.ndim == 3 and q.shape == k.shape == v.shape, "(total, heads, head_dim)"
    for cu_seqlens, longest in ((cu_seqlens_q, max_seqlen_q), (cu_seqlens_k, max_seqlen_k)):
        assert cu_seqlens.dtype == torch.int32 and cu_seqlens.ndim == 1
        assert cu_seqlens[0] == 0 and cu_seqlens[-1] == len(q)
        assert isinstance(longest, int) and longest == int(torch.diff(cu_seqlens).max())
    lengths = torch.diff(cu_seqlens_q).tolist()
    parts = zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True)
    heads_first = (
        F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in p), is_causal=causal) for p in parts
    )
    return torch.cat([out.transpose(0, 1) for out in heads_first])


@pytest.mark.slow
@pytest.mark.multiproc
def test_text_packing_runs(tmp_path, monkeypatch):
    blocks = python_blocks(DOCS / "how-to" / "text-packing.md")
    assert len(blocks) == 7
    code = "\n".join(blocks)
    assert GPU_LINE in code
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(
        sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)
    )
    namespace: dict = {}
    exec(
        compile(code.replace(GPU_LINE, 'device, dtype = "cpu", torch.float32'), "text-packing.md", "exec"),
        namespace,
    )
    batch, out = namespace["batch"], namespace["out"]
    assert out.shape == (batch["input_ids"].shape[1], 4, 64)
    assert len(namespace["went_on"]) == len(namespace["train"]) - 3 > 0


def test_the_stand_in_is_attention_within_each_example():
    q, k, v = (torch.randn(7, 2, 8) for _ in range(3))
    cu_seqlens = torch.tensor([0, 3, 7], dtype=torch.int32)
    out = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=4, max_seqlen_k=4, causal=True
    )
    alone = F.scaled_dot_product_attention(*(t[3:].transpose(0, 1) for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(out[3:], alone.transpose(0, 1))
