"""Packing: valid tokens per second of a small causal LM trained on packed rows vs on padded batches.

Data: ``make_token_arrow`` token sequences, lengths log-normal (median 64, clipped to 8..512), read through
``loader.ArrowDataset``; and the same sequences saved by Hugging Face ``datasets`` (``save_to_disk``, two
shards), the padded side reading the ``datasets.Dataset`` itself, the packed side ``loader.ArrowDataset``
over its folder. Model: ``tests/_causal_lm.py``, 2 layers of width 128, vocabulary 2,048, fp32 on
the CPU, AdamW; a step is forward, backward and update.

The budget per step is the same: B x max_len = 8 x 512 token slots. Padded: 8 examples in a random order,
right-padded to the longest of them (torch's DataLoader, pad_sequence; causal attention over the row, which
never reaches the padding on the right). Packed: one ``PackedBatchSampler`` pack (first-fit decreasing) of at
most 4,096 tokens, collated by ``PackingCollator``, attention within each example between ``cu_seqlens`` as
``flash_attn_varlen_func`` does. Both take every example once per epoch; valid tokens are the examples'
tokens. The two are interleaved step by step (a padded step whenever the padded side has trained fewer tokens
than the packed side), so noise on this shared machine falls on both alike; the ratio of the totals over
EPOCHS epochs must be >= 1.5. The padding each algorithm leaves at max_len 512 is printed too.

    python -m pytest benchmarks/bench_packing.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

import loader
from loader.packing import ALGORITHMS, IGNORE_INDEX, PackedBatchSampler, PackingCollator, packing_report
from stallbench.report import plain_table
from stallbench.workloads import make_token_arrow
from tests._causal_lm import CausalLM, token_losses

VOCAB, MAX_LEN, BATCH, EXAMPLES, EPOCHS = 2048, 512, 8, 700, 3
MIN_RATIO, MIN_EFFICIENCY = 1.5, 0.98
KINDS = ("padded", "packed")


def pad_collate(examples: list[tuple[torch.Tensor, None]]) -> dict[str, torch.Tensor]:
    ids = [tokens for tokens, _ in examples]
    input_ids = pad_sequence(ids, batch_first=True, padding_value=0)
    return {
        "input_ids": input_ids,
        "position_ids": torch.arange(input_ids.shape[1]).expand_as(input_ids),
        "labels": pad_sequence(ids, batch_first=True, padding_value=IGNORE_INDEX),
    }


def hf_pad_collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A Hugging Face dataset's rows (``with_format("torch")``), padded as ``pad_collate`` pads."""
    return pad_collate([(row["input_ids"], None) for row in rows])


def valid_tokens(batch: dict) -> int:
    """The examples' tokens in a batch: a packed row is nothing else; padding is labelled -100."""
    if "cu_seqlens" in batch:
        return int(batch["cu_seqlens"][-1])
    return int((batch["labels"] != IGNORE_INDEX).sum())


class Training:
    """One model trained on both kinds of batch, each step timed and its valid tokens counted."""

    def __init__(self, data: Path, padded_from: Any = None) -> None:
        """``padded_from``: the padded side's dataset (a Hugging Face ``datasets.Dataset``), else ours."""
        dataset = loader.ArrowDataset(str(data))
        self.lengths = dataset.source.token_lengths()
        sampler = PackedBatchSampler(self.lengths, BATCH * MAX_LEN, seed=0)
        self.loaders = {
            "padded": torch.utils.data.DataLoader(
                dataset if padded_from is None else padded_from,
                BATCH,
                shuffle=True,
                generator=torch.Generator().manual_seed(0),
                collate_fn=pad_collate if padded_from is None else hf_pad_collate,
            ),
            "packed": torch.utils.data.DataLoader(
                dataset, batch_sampler=sampler, collate_fn=PackingCollator(BATCH * MAX_LEN, block_mask=False)
            ),
        }
        torch.manual_seed(0)
        self.model = CausalLM(VOCAB, dim=128, heads=4, layers=2, positions=MAX_LEN)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.tokens = dict.fromkeys(KINDS, 0)
        self.steps = dict.fromkeys(KINDS, 0)
        self.slots = dict.fromkeys(KINDS, 0)  # token positions computed, padding included

    def step(self, kind: str, batch: dict) -> None:
        start = time.perf_counter()
        cu_seqlens = batch.get("cu_seqlens")
        logits = self.model(batch["input_ids"], batch["position_ids"], cu_seqlens=cu_seqlens)
        losses = token_losses(logits, batch["labels"])
        loss = losses.sum() / (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.seconds[kind] += time.perf_counter() - start
        self.tokens[kind] += valid_tokens(batch)
        self.slots[kind] += batch["input_ids"].numel()
        self.steps[kind] += 1

    def epoch(self) -> None:
        """Both kinds over every example, interleaved so that neither runs ahead by more than a step."""
        padded, packed = iter(self.loaders["padded"]), iter(self.loaders["packed"])
        for batch in packed:
            self.step("packed", batch)
            while self.tokens["padded"] < self.tokens["packed"] and (padded_batch := next(padded, None)):
                self.step("padded", padded_batch)
        for batch in padded:
            self.step("padded", batch)

    def tokens_per_s(self, kind: str) -> float:
        return self.tokens[kind] / self.seconds[kind]


@pytest.fixture(scope="module", params=["arrow", "hugging-face"])
def training(request, bench_data_root: Path) -> Training:
    """The same sequences in an Arrow file, or saved by Hugging Face ``datasets`` (the padded side then
    reads the ``datasets.Dataset`` itself, as a user's script does; the packed side our source of it)."""
    data = make_token_arrow(
        bench_data_root / f"packing-tokens-{EXAMPLES}.arrow",
        num_sequences=EXAMPLES,
        min_len=8,
        max_len=MAX_LEN,
        vocab=VOCAB,
    )
    if request.param == "arrow":
        return Training(data)
    import datasets

    saved = bench_data_root / f"packing-tokens-{EXAMPLES}-hf"
    if not saved.exists():
        source = loader.ArrowDataset(str(data)).source
        rows = [np.frombuffer(source.read(i), "<i4").tolist() for i in range(len(source))]
        datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(saved), num_shards=2)
    return Training(saved, padded_from=datasets.load_from_disk(str(saved)).with_format("torch"))


@pytest.mark.benchmark(group="packing")
def test_packing_training(benchmark, training: Training) -> None:
    benchmark.pedantic(training.epoch, rounds=EPOCHS, warmup_rounds=0)
    while training.steps["packed"] < EPOCHS * len(training.loaders["packed"]):  # benchmarks disabled: 1 round
        training.epoch()
    ratio = training.tokens_per_s("packed") / training.tokens_per_s("padded")
    benchmark.extra_info.update(ratio=ratio, **{f"{k}_tokens_per_s": training.tokens_per_s(k) for k in KINDS})
    rows = [
        [k, training.steps[k], training.slots[k], training.tokens[k], f"{training.tokens_per_s(k):,.0f}"]
        for k in KINDS
    ]
    print(f"\npacking: valid tokens/s, packed / padded = {ratio:.2f} (target >= {MIN_RATIO})")
    print(plain_table(["batches", "steps", "token slots", "valid tokens", "valid tokens/s"], rows))
    assert training.tokens["packed"] == training.tokens["padded"] == EPOCHS * int(training.lengths.sum())
    assert ratio >= MIN_RATIO, f"packed/padded valid tokens per second {ratio:.2f}"


def test_packing_efficiency(bench_data_root: Path) -> None:
    """Padding before and after, at max_len 512, on 50,000 of the same log-normal lengths."""
    data = make_token_arrow(
        bench_data_root / "packing-tokens-50000.arrow",
        num_sequences=50_000,
        min_len=8,
        max_len=MAX_LEN,
        vocab=VOCAB,
    )
    lengths = loader.ArrowDataset(str(data)).source.token_lengths()
    rows, reports = [], {}
    for algorithm in ALGORITHMS:
        start = time.perf_counter()
        reports[algorithm] = report = packing_report(lengths, MAX_LEN, algorithm)
        seconds = time.perf_counter() - start
        fractions = [report.padded_fraction, report.packed_fraction, report.efficiency]
        rows.append([algorithm, report.packs, report.fewest_packs, *(f"{f:.4f}" for f in fractions), seconds])
    print(f"\npacking {len(lengths):,} examples, {int(np.sum(lengths)):,} tokens, at max_len {MAX_LEN}:")
    print(plain_table(["algorithm", "packs", "fewest", "padded", "packed", "efficiency", "seconds"], rows))
    assert min(reports["ffd"].efficiency, reports["spfhp"].efficiency) >= MIN_EFFICIENCY
