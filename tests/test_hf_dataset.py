"""A Hugging Face dataset saved to disk as a source: its rows read from its own Arrow files (images, labels,
token sequences), laid end to end over its shards, through our cache as through torch's loader."""

from __future__ import annotations

import io
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import torch.utils.data
from PIL import Image

from loader import ArrowDataset, DataLoader, HFDatasetSource, SourceError

IMAGES = 24


def jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (12, 10), (i * 10 % 256, 40, 200)).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[Path, datasets.Dataset]:
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])}
    )
    rows = {
        "image": [{"bytes": jpeg(i), "path": None} for i in range(IMAGES)],
        "label": [i % 3 for i in range(IMAGES)],
    }
    ds = datasets.Dataset.from_dict(rows, features=features)
    path = tmp_path_factory.mktemp("hf") / "images"
    ds.save_to_disk(str(path), num_shards=3)
    return path, ds


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> tuple[Path, list[list[int]]]:
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 50_000, rng.integers(1, 40)).tolist() for _ in range(50)]
    path = tmp_path_factory.mktemp("hf") / "tokens"
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(path), num_shards=2)
    return path, rows


def test_the_rows_of_every_shard_are_read_end_to_end_with_their_labels(images):
    path, ds = images
    source = HFDatasetSource(path)
    assert len(source.parts) == 3 and len(source) == IMAGES
    assert (source.column, source.label_column, source.kind) == ("image", "label", "binary")
    assert [source.read(i) for i in range(IMAGES)] == [jpeg(i) for i in range(IMAGES)]
    assert [source.label(i) for i in range(IMAGES)] == ds["label"]
    assert source.describe(IMAGES - 1).endswith("data-00002-of-00003.arrow:7")
    assert HFDatasetSource(path).fingerprint == source.fingerprint


def test_one_of_its_arrow_files_opens_alone(images):
    path, _ = images
    reloaded = datasets.load_from_disk(str(path))
    first = reloaded.cache_files[0]["filename"]
    alone = ArrowDataset(first, label_column="label")
    assert len(alone) == 8 and alone.source.read(3) == jpeg(3) and alone.source.label(3) == 0


def test_token_sequences_come_back_whole_and_their_lengths_for_packing(tokens):
    path, rows = tokens
    dataset = ArrowDataset(str(path))
    assert dataset.source.kind == "tokens" and dataset.source.label_column is None
    assert [dataset[i][0].tolist() for i in range(len(rows))] == rows
    assert dataset.source.token_lengths().tolist() == [len(r) for r in rows]


@pytest.mark.multiproc
def test_our_loader_gives_torch_s_batches_and_caches_the_rows(images, shm_dir):
    path, _ = images
    dataset = ArrowDataset(str(path), transform="eval")
    common = dict(batch_size=5, shuffle=True, num_workers=2)

    def epochs(dl) -> list:
        return [[(x.tolist(), y.tolist()) for x, y in dl] for _ in range(2)]

    want = epochs(torch.utils.data.DataLoader(dataset, **common, generator=torch.Generator().manual_seed(4)))
    ours = DataLoader(dataset, **common, generator=torch.Generator().manual_seed(4), cache_bytes=1 << 24,
                      cache_dir=shm_dir, cache_form="raw")  # fmt: skip
    assert epochs(ours) == want
    assert (ours.stats().misses, ours.stats().hits) == (IMAGES, IMAGES)


def test_stallbench_opens_a_saved_dataset_as_data(images):
    from stallbench.jobs.data import make_dataset

    path, ds = images
    dataset = make_dataset(path, "eval")
    assert len(dataset) == IMAGES and [dataset[i][1] for i in (0, 4)] == ds["label"][:5:4]


def test_bad_saved_datasets_are_named(images, tmp_path):
    path, _ = images
    with pytest.raises(SourceError, match="has no column 'class'"):
        HFDatasetSource(path, label_column="class")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "state.json").write_text(json.dumps({"_data_files": "nope"}))
    with pytest.raises(SourceError, match="broken' is not a dataset save_to_disk wrote"):
        HFDatasetSource(broken)
    with pytest.raises(SourceError, match="nowhere' does not exist"):
        HFDatasetSource(tmp_path / "nowhere")
    both = tmp_path / "both"
    datasets.Dataset.from_dict({"a": [b"x"], "b": [[1, 2]]}).save_to_disk(str(both))
    with pytest.raises(
        SourceError, match=r"name the record column; binary or list<int> columns: \['a', 'b'\]"
    ):
        HFDatasetSource(both)
