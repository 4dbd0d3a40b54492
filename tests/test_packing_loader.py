"""Packs through a DataLoader, torch's and ours, with and without workers, over a token file; and a saved
place restored in a new process, as a restarted job is: the same packed batches follow (every case saved in
one new process and restored in another, ``_job_batch``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _job_batch import OUT, STATE, Restarts

import loader
from loader.packing import PackedBatchSampler, PackingCollator
from stallbench.workloads import make_token_arrow

JOB = Path(__file__).with_name("_packing_job.py")
MAX_LEN = 64  # as in the job
RESTARTS = [  # (kind, workers, algorithm, at)
    ("sampler", 0, "ffd", 9),
    ("sampler", 0, "nextfit", "end"),
    ("torch", 0, "spfhp", 9),
    ("torch", 2, "ffd", 9),
    ("ours", 0, "nextfit", 9),
    ("ours", 2, "ffd", 9),
    ("ours", 2, "spfhp", "end"),
]


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


@pytest.fixture(scope="module")
def restarts(tokens, tmp_path_factory) -> Restarts:
    """Every restart case below, each with a sampler and loader of its own: saved by one new process,
    restored by another."""
    restarts = Restarts(JOB, tmp_path_factory.mktemp("packing-restarts"), timeout=120)
    for case in RESTARTS:
        restarts.add("-".join(map(str, case)), save=[tokens, STATE, OUT, *case])  # the same load
    return restarts


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize(("kind", "workers", "algorithm", "at"), RESTARTS)
def test_a_restarted_job_goes_on_with_the_same_packs(restarts, kind, workers, algorithm, at):
    went_on, again = restarts.outcome("-".join(map(str, (kind, workers, algorithm, at))))
    assert len(went_on) > 0 and again == went_on
