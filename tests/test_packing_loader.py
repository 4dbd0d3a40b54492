"""Packs through a DataLoader, torch's and ours, with and without workers, over a token file; and a saved
place restored in a new process, as a restarted job is: the same packed batches follow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import loader
from loader.packing import PackedBatchSampler, PackingCollator
from stallbench.workloads import make_token_arrow

JOB = Path(__file__).with_name("_packing_job.py")
MAX_LEN = 64  # as in the job


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("packing") / "tokens.arrow"
    return make_token_arrow(path, num_sequences=300, min_len=2, max_len=MAX_LEN, vocab=1000, seed=3)


def test_token_lengths_are_the_records_lengths(tokens):
    dataset = loader.ArrowDataset(str(tokens))
    lengths = dataset.source.token_lengths()
    assert lengths.dtype == np.int64 and len(lengths) == len(dataset) == 300
    assert lengths.tolist() == [len(dataset[i][0]) for i in range(len(dataset))]


@pytest.mark.multiproc
@pytest.mark.parametrize(
    "loader_class", [torch.utils.data.DataLoader, loader.DataLoader], ids=["torch", "ours"]
)
@pytest.mark.parametrize("workers", [0, 2])
def test_each_step_is_one_pack_of_the_datasets_examples(tokens, loader_class, workers):
    dataset = loader.ArrowDataset(str(tokens))
    lengths = dataset.source.token_lengths()
    sampler = PackedBatchSampler(lengths, MAX_LEN, algorithm="spfhp", seed=1)
    expected = list(PackedBatchSampler(lengths, MAX_LEN, algorithm="spfhp", seed=1))
    collate = PackingCollator(MAX_LEN, pad_to_max=True)
    batches = list(loader_class(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers))
    assert len(batches) == len(expected) and sorted(i for p in expected for i in p) == list(range(300))
    for batch, pack in zip(batches, expected, strict=True):
        ids = torch.cat([dataset[i][0] for i in pack])
        assert torch.equal(batch["input_ids"][0, : len(ids)], ids)
        assert batch["input_ids"].shape == (1, MAX_LEN) and batch["attention_mask"].shape[-1] == MAX_LEN
        assert batch["cu_seqlens"][: len(pack) + 1].tolist() == [0, *np.cumsum(lengths[pack]).tolist()]


def run_job(*args: object) -> None:
    env = {**os.environ, "PYTHONPATH": str(JOB.parent.parent)}
    subprocess.run([sys.executable, str(JOB), *map(str, args)], check=True, env=env, timeout=120)


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "workers", "algorithm", "at"),
    [
        ("sampler", 0, "ffd", 9),
        ("sampler", 0, "nextfit", "end"),
        ("torch", 0, "spfhp", 9),
        ("torch", 2, "ffd", 9),
        ("ours", 0, "nextfit", 9),
        ("ours", 2, "ffd", 9),
        ("ours", 2, "spfhp", "end"),
    ],
)
def test_a_restarted_job_goes_on_with_the_same_packs(tokens, tmp_path, kind, workers, algorithm, at):
    state, saved, restored = tmp_path / "state.pt", tmp_path / "saved.json", tmp_path / "restored.json"
    run_job("save", tokens, state, saved, kind, workers, algorithm, at)
    run_job("load", tokens, state, restored, kind, workers, algorithm, at)
    went_on, again = json.loads(saved.read_text()), json.loads(restored.read_text())
    assert len(went_on) > 0 and again == went_on
