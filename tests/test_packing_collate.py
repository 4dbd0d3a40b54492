"""PackingCollator: the keys, dtypes and shapes a varlen or masked model takes, and labels at boundaries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loader.packing import IGNORE_INDEX, PackingCollator, block_causal_mask

EXAMPLES = [[11, 12, 13], [21, 22], [31], [41, 42, 43, 44]]


def tensors(lists: list[list[int]]) -> list[torch.Tensor]:
    return [torch.tensor(ids) for ids in lists]


def test_the_keys_and_their_values():
    batch = PackingCollator(16)(tensors(EXAMPLES))
    assert sorted(batch) == sorted(
        ["input_ids", "position_ids", "labels", "cu_seqlens", "max_seqlen", "attention_mask"]
    )
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 22, 31, 41, 42, 43, 44]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]]
    assert batch["labels"].tolist() == [[-100, 12, 13, -100, 22, -100, -100, 42, 43, 44]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 6, 10]
    assert batch["max_seqlen"] == 4 and type(batch["max_seqlen"]) is int
    dtypes = {k: v.dtype for k, v in batch.items() if isinstance(v, torch.Tensor)}
    assert dtypes == {
        "input_ids": torch.int64,
        "position_ids": torch.int64,
        "labels": torch.int64,
        "cu_seqlens": torch.int32,
        "attention_mask": torch.bool,
    }
    assert batch["attention_mask"].shape == (1, 1, 10, 10)


def test_each_label_after_a_boundary_is_ignored():
    """With the usual shift (position t predicts label t + 1) no position learns the next example's first
    token: every example's first label is -100, and every other label is its own token."""
    batch = PackingCollator(16)(tensors(EXAMPLES))
    ids, labels, starts = batch["input_ids"][0], batch["labels"][0], batch["cu_seqlens"][:-1].long()
    assert (labels[starts] == IGNORE_INDEX).all()
    others = torch.ones_like(labels, dtype=torch.bool)
    others[starts] = False
    assert torch.equal(labels[others], ids[others])


def test_the_mask_is_causal_within_each_example_and_false_across():
    mask = PackingCollator(16)(tensors(EXAMPLES))["attention_mask"][0, 0]
    example = [k for k, ids in enumerate(EXAMPLES) for _ in ids]
    for query in range(len(example)):
        for key in range(len(example)):
            assert mask[query, key] == (example[query] == example[key] and key <= query), (query, key)


def test_block_causal_mask_of_one_example_is_the_causal_mask():
    mask = block_causal_mask(torch.tensor([0, 5], dtype=torch.int32))
    assert torch.equal(mask[0, 0], torch.ones(5, 5, dtype=torch.bool).tril())


def test_own_labels_keep_their_masking_and_lose_their_first():
    examples = [{"input_ids": [1, 2, 3, 4], "labels": [7, -100, 3, 4]}, {"input_ids": [5, 6]}]
    batch = PackingCollator(8)(examples)
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, -100, 6]]
    assert examples[0]["labels"] == [7, -100, 3, 4]  # the example itself is left alone


@pytest.mark.parametrize(
    "example",
    [
        torch.tensor([3, 4, 5]),
        np.array([3, 4, 5], dtype="<i4"),
        [3, 4, 5],
        {"input_ids": torch.tensor([3, 4, 5], dtype=torch.int32)},
        (torch.tensor([3, 4, 5]), None),  # what loader.ArrowDataset gives
    ],
    ids=["tensor", "int32-array", "list", "dict", "pair"],
)
def test_kinds_of_example(example):
    batch = PackingCollator(8)([example, torch.tensor([6])])
    assert batch["input_ids"].tolist() == [[3, 4, 5, 6]] and batch["input_ids"].dtype == torch.int64


def test_pad_to_max_adds_a_padding_segment():
    batch = PackingCollator(8, pad_to_max=True, pad_id=0)([[5, 6, 7], [8, 9]])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 8]
    assert batch["attention_mask"].shape == (1, 1, 8, 8)
    full = PackingCollator(5, pad_to_max=True)([[5, 6, 7], [8, 9]])
    assert full["cu_seqlens"].tolist() == [0, 3, 5]


def test_flash_attention_names_and_no_mask():
    batch = PackingCollator(16, block_mask=False, flash_attn_names=True)(tensors(EXAMPLES))
    assert "attention_mask" not in batch
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(batch[name], batch["cu_seqlens"]) and batch[name].dtype == torch.int32
    assert batch["max_length_q"] == batch["max_length_k"] == batch["max_seqlen"] == 4


def test_a_pack_longer_than_max_len_is_refused():
    with pytest.raises(ValueError, match=r"holds 10 tokens, more than max_len=9"):
        PackingCollator(9)(tensors(EXAMPLES))


@pytest.mark.parametrize(
    ("examples", "message"),
    [
        ([], "at least one example"),
        ([[1, 2], []], "example 1 of the pack must be a non-empty"),
        ([torch.tensor([1.0, 2.0])], "example 0 of the pack must be .* integers"),
        ([torch.tensor([[1, 2]])], "example 0 of the pack must be a non-empty 1-D"),
        ([{"input_ids": [1, 2], "labels": [1]}], "example 0 of the pack has 2 tokens but 1 labels"),
    ],
)
def test_bad_examples_are_named(examples, message):
    with pytest.raises(ValueError, match=message):
        PackingCollator(8)(examples)


@pytest.mark.parametrize("max_len", [0, -3, 2.5, True])
def test_max_len_must_be_a_positive_int(max_len):
    with pytest.raises(ValueError, match="max_len must be a positive number of tokens"):
        PackingCollator(max_len)
