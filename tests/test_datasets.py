"""The ready-made datasets over each format, through the DataLoader and its cache."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
from helpers import make_jpeg_folder

import loader
from loader import ArrowDataset, DataLoader, ImageFolder, LMDBDataset
from loader.sources import image_folder_to_arrow, image_folder_to_lmdb


@pytest.fixture
def images(tmp_path):
    return make_jpeg_folder(tmp_path / "imgs", per_class=3, classes=2, size=(300, 260))


def test_every_image_format_gives_the_same_eval_batches(images, tmp_path, shm_dir):
    datasets = [
        ImageFolder(images, transform="eval"),
        LMDBDataset(image_folder_to_lmdb(images, tmp_path / "imgs.lmdb").path, transform="eval"),
        ArrowDataset(
            image_folder_to_arrow(images, tmp_path / "a.arrow").path, label_column="label", transform="eval"
        ),
    ]
    results = []
    for data in datasets:
        dl = DataLoader(data, batch_size=6, cache_bytes=1 << 22, cache_dir=shm_dir)
        ((x, y),) = list(dl)
        assert x.shape == (6, 3, 224, 224) and dl.stats().records_cached == 6
        results.append((x, y.tolist()))
    assert all(torch.equal(x, results[0][0]) and y == results[0][1] for x, y in results)
    assert results[0][1] == [0, 0, 0, 1, 1, 1]


def test_token_sequences_come_back_as_int64_tensors(tmp_path, shm_dir):
    seqs = [[1, 2, 3], [4], [5, 6], [70000, 8, 9, 10]]
    path = tmp_path / "tokens.arrow"
    with (
        pa.OSFile(str(path), "wb") as sink,
        pa.ipc.new_file(sink, pa.schema([("tokens", pa.list_(pa.int32()))])) as w,
    ):
        w.write_table(pa.table({"tokens": pa.array(seqs, pa.list_(pa.int32()))}))
    data = ArrowDataset(path)
    dl = DataLoader(data, batch_size=None, cache_bytes=1 << 20, cache_dir=shm_dir)
    for _ in range(2):
        got = [(t.dtype, t.tolist(), label) for t, label in dl]
        assert got == [(torch.int64, s, None) for s in seqs]
    assert dl.stats().hits == len(seqs)


def test_unknown_transform_name_lists_the_choices(images):
    with pytest.raises(ValueError, match="train"):
        ImageFolder(images, transform="center")


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(loader.SourceError, match="nowhere"):
        ImageFolder(tmp_path / "nowhere")


def test_jobs_open_arrow_with_its_label_column(images, tmp_path):
    from stallbench.jobs.data import make_dataset

    data = make_dataset(image_folder_to_arrow(images, tmp_path / "imgs.arrow").path, "eval")
    assert data.source.columns == ["image", "label"] and [data[i][1] for i in (0, 5)] == [0, 1]


def test_jobs_open_tar_shards_from_their_folder_or_one_shard(images, tmp_path):
    from stallbench.jobs.data import make_dataset

    shards = loader.sources.image_folder_to_tar_shards(images, tmp_path / "shards", shard_bytes=1)
    whole, one = make_dataset(tmp_path / "shards", "eval"), make_dataset(shards.shards[0], "eval")
    assert isinstance(whole, loader.TarShards) and len(whole) == len(ImageFolder(images)) > len(one) == 1
    assert torch.equal(whole[0][0], ImageFolder(images, transform="eval")[0][0])
