"""WebDataset tar shards as a source: records and labels by offset, shuffled through our cache as through
torch's loader, the samples a shard's members group into, and errors that name the shard and the sample."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
from pathlib import Path

import pytest
import torch
import torch.utils.data
from helpers import make_jpeg_folder

from loader import (
    DataLoader,
    ImageFolderSource,
    SourceDataset,
    SourceError,
    TarShards,
    TarShardsSource,
    TrainTransform,
)
from loader.errors import BadRecordError
from loader.sources import image_folder_to_tar_shards


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_jpeg_folder(tmp_path_factory.mktemp("tar") / "imgs", per_class=10, classes=3)


@pytest.fixture(scope="module")
def shards(images: Path) -> Path:
    return image_folder_to_tar_shards(images, images.parent / "shards", shard_bytes=20_000).shards[0]


def write_shard(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_converted_shards_hold_the_folder_s_records_and_labels_in_order(images, shards):
    folder, source = ImageFolderSource(images), TarShardsSource(Path(shards).parent)
    assert len(source.shards) > 2  # small shards: the records span several
    assert len(source) == len(folder) == 30 and source.nbytes == folder.nbytes
    assert [source.read(i) for i in range(30)] == [folder.read(i) for i in range(30)]
    assert [source.label(i) for i in range(30)] == [folder.label(i) for i in range(30)]
    assert source.describe(0) == f"{source.shards[0]}[00000000]"
    assert TarShardsSource(source.shards).fingerprint == source.fingerprint  # a list of the same shards


def test_a_sample_is_the_members_of_one_key_and_one_without_an_image_is_left_out(tmp_path):
    shard = write_shard(
        tmp_path / "a.tar",
        {
            "n01/img_1.JPG": b"first",
            "n01/img_1.cls": b" 7\n",
            "n01/img_1.json": b"{}",
            "text_only.txt": b"no image",
            "n02/img_2.seg.png": b"a mask: another field, not the image",
            "n02/img_2.webp": b"second",
        },
    )
    source = TarShardsSource(shard)
    assert [source.read(i) for i in range(len(source))] == [b"first", b"second"]
    assert [source.label(i) for i in range(2)] == [7, None]
    assert source.describe(1) == f"{shard}[n02/img_2]"


def test_our_loader_gives_torch_s_batches_and_its_cache_serves_epoch_two(shards, shm_dir):
    dataset = TarShards(Path(shards).parent, transform=TrainTransform(size=16))
    common = dict(batch_size=4, shuffle=True, num_workers=2)

    def epochs(dl) -> list:
        torch.manual_seed(3)
        return [[(x.tolist(), y.tolist()) for x, y in dl] for _ in range(2)]

    want = epochs(torch.utils.data.DataLoader(dataset, **common, generator=torch.Generator().manual_seed(1)))
    ours = DataLoader(dataset, **common, generator=torch.Generator().manual_seed(1), cache_bytes=1 << 24,
                      cache_dir=shm_dir, cache_form="raw")  # fmt: skip
    assert epochs(ours) == want
    stats = ours.stats()
    assert (stats.misses, stats.hits, stats.records_cached) == (30, 30, 30)


def test_the_index_crosses_into_a_worker_in_its_pickle_without_open_files(shards):
    source = TarShardsSource(Path(shards).parent)
    source.read(0)
    copy = pickle.loads(pickle.dumps(source))
    assert copy._fds == {} and [copy.read(i) for i in (0, 29)] == [source.read(i) for i in (0, 29)]


def test_a_changed_shard_changes_the_fingerprint(tmp_path):
    shard = write_shard(tmp_path / "a.tar", {"k.jpg": b"one"})
    before = TarShardsSource(shard).fingerprint
    write_shard(shard, {"k.jpg": b"two!"})
    assert TarShardsSource(shard).fingerprint != before


def test_bad_shards_are_named(tmp_path):
    with pytest.raises(SourceError, match=r"holds no \.tar shards"):
        TarShardsSource(tmp_path)
    with pytest.raises(SourceError, match=r"nowhere\.tar' does not exist"):
        TarShardsSource(tmp_path / "nowhere.tar")
    plain = write_shard(tmp_path / "plain.tar", {"k.jpg": b"x"})
    (tmp_path / "gz.tar").write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(SourceError, match=r"gz\.tar' cannot be listed .*uncompressed tar"):
        TarShardsSource(tmp_path / "gz.tar")
    with pytest.raises(SourceError, match=r"the label of .*bad.tar\[k\] is not an integer: b'cat'"):
        TarShardsSource(write_shard(tmp_path / "bad.tar", {"k.jpg": b"x", "k.cls": b"cat"}))
    with pytest.raises(SourceError, match="hold no sample with an image member"):
        TarShardsSource(write_shard(tmp_path / "none.tar", {"k.txt": b"x"}))


def test_a_shard_cut_short_names_the_sample_and_skip_goes_on(tmp_path, shm_dir):
    shard = write_shard(tmp_path / "cut.tar", {"a.jpg": b"a" * 600, "b.jpg": b"b" * 600})
    source = TarShardsSource(shard)
    os.truncate(shard, 512 + 1024 + 512 + 100)  # a's header and blocks, b's header: b ends 500 bytes early
    assert source.read(0) == b"a" * 600
    with pytest.raises(BadRecordError, match=r"cut.tar\[b\].*the shard ends 500 bytes early"):
        source.read(1)
    ours = dict(on_error="skip", cache_bytes=1 << 20, cache_dir=shm_dir)
    dl = DataLoader(SourceDataset(source), batch_size=2, collate_fn=list, **ours)
    assert list(dl) == [[(b"a" * 600, None)]] and dl.stats().records_skipped == 1
