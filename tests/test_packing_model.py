"""Packing changes nothing a model computes: a small causal transformer (fp32, CPU) gives each packed example
the logits and loss it gives that example alone, with the block mask (SDPA) or with ``cu_seqlens``."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from loader.packing import PackingCollator
from tests._causal_lm import CausalLM, token_losses

VOCAB, MAX_LEN = 50, 48
LENGTHS = [7, 1, 12, 3, 9]  # a one-token example too: it predicts nothing and is predicted by nothing
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def model() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(VOCAB, positions=MAX_LEN)


def make_examples(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=generator) for n in LENGTHS]


def alone(model: CausalLM, example: torch.Tensor) -> torch.Tensor:
    """The example's logits (1, n, vocab), run by itself, unpadded."""
    return model(example[None], torch.arange(len(example))[None])


def packed(model: CausalLM, batch: dict, attention: str) -> torch.Tensor:
    if attention == "mask":
        return model(batch["input_ids"], batch["position_ids"], attn_mask=batch["attention_mask"])
    return model(batch["input_ids"], batch["position_ids"], cu_seqlens=batch["cu_seqlens"])


def spans(batch: dict) -> list[tuple[int, int]]:
    bounds = batch["cu_seqlens"].tolist()
    return list(itertools.pairwise(bounds))


@torch.no_grad()
@pytest.mark.parametrize("attention", ["mask", "cu_seqlens"])
@pytest.mark.parametrize("pad_to_max", [False, True])
def test_packed_logits_and_loss_are_each_examples_alone(model, attention, pad_to_max):
    examples = make_examples(0)
    batch = PackingCollator(MAX_LEN, pad_to_max=pad_to_max)(examples)
    logits = packed(model, batch, attention)
    losses = token_losses(logits, batch["labels"])[0]
    own_losses = []
    for example, (start, end) in zip(examples, spans(batch), strict=False):
        own = alone(model, example)
        torch.testing.assert_close(logits[:, start:end], own, **TOLERANCE)
        own_losses.append(F.cross_entropy(own[0, :-1], example[1:], reduction="none"))
        torch.testing.assert_close(losses[start : end - 1], own_losses[-1], **TOLERANCE)
        if end < logits.shape[1]:
            assert losses[end - 1] == 0  # the last token is not asked to predict the next example's first
    counted = (batch["labels"][0, 1:] != -100).sum()
    assert counted == sum(n - 1 for n in LENGTHS)
    torch.testing.assert_close(losses.sum() / counted, torch.cat(own_losses).mean(), **TOLERANCE)


@torch.no_grad()
@pytest.mark.parametrize("attention", ["mask", "cu_seqlens"])
def test_no_position_attends_across_a_boundary(model, attention):
    examples = make_examples(1)
    before = packed(model, PackingCollator(MAX_LEN)(examples), attention)
    for changed in range(len(examples)):
        other = [e if k != changed else (e + 1) % VOCAB for k, e in enumerate(examples)]
        batch = PackingCollator(MAX_LEN)(other)
        after = packed(model, batch, attention)
        for k, (start, end) in enumerate(spans(batch)):
            if k == changed:
                assert not torch.allclose(after[:, start:end], before[:, start:end])
            else:
                assert torch.equal(after[:, start:end], before[:, start:end]), (changed, k)


@torch.no_grad()
def test_the_check_sees_a_pack_without_boundaries(model):
    """Plain causal attention over the row, or positions that run on: later examples' logits change, so
    the comparisons above would fail for a packing that is not boundary-aware."""
    examples = make_examples(0)
    batch = PackingCollator(MAX_LEN)(examples)
    running_positions = torch.arange(batch["input_ids"].shape[1])[None]
    leaky = [
        model(batch["input_ids"], batch["position_ids"]),
        model(batch["input_ids"], running_positions, attn_mask=batch["attention_mask"]),
    ]
    start, end = spans(batch)[2]
    for logits in leaky:
        assert not torch.allclose(logits[:, start:end], alone(model, examples[2]), **TOLERANCE)
