"""An image folder in object storage (``s3://``): a real S3-compatible server (moto's, started and stopped
here on loopback) serves the records to our loader as a local folder would; errors name the object."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.utils.data
from helpers import make_jpeg_folder, upload_jpegs
from shaped_s3 import shaped_s3_server

from loader import (
    ArrowDataset,
    DataLoader,
    ImageFolder,
    ImageFolderSource,
    SourceError,
    TarShards,
    TarShardsSource,
)
from loader.errors import BadRecordError
from loader.sources import ArrowSource, S3ImageFolderSource, _object_files, image_folder_to_tar_shards

pytestmark = pytest.mark.multiproc


@pytest.fixture
def server(s3_server) -> subprocess.Popen:
    return s3_server


@pytest.fixture
def bucket(server, tmp_path) -> tuple[str, Path]:
    """``s3://data/train`` holding the local folder's images, and that folder."""
    local = make_jpeg_folder(tmp_path / "imgs", per_class=6, classes=3)
    upload_jpegs(local)
    boto3.client("s3").put_object(Bucket="data", Key="train/README.txt", Body=b"not an image")
    return "s3://data/train", local


def test_objects_are_the_folder_s_records_labels_and_classes(bucket):
    url, local = bucket
    remote, folder = S3ImageFolderSource(url), ImageFolderSource(local)
    assert remote.classes == folder.classes and len(remote) == len(folder) == 18
    assert [remote.read(i) for i in range(18)] == [folder.read(i) for i in range(18)]
    assert [remote.label(i) for i in range(18)] == [folder.label(i) for i in range(18)]
    assert remote.describe(0) == "s3://data/train/class0/img000.jpg" and remote.nbytes == folder.nbytes
    assert S3ImageFolderSource(url + "/").fingerprint == remote.fingerprint


def test_our_loader_reads_them_as_torch_s_reads_the_folder_and_caches_them(bucket, shm_dir):
    url, local = bucket
    common = dict(batch_size=4, shuffle=True, num_workers=2)

    def epochs(dl) -> list:
        torch.manual_seed(2)
        return [[(x.tolist(), y.tolist()) for x, y in dl] for _ in range(2)]

    torch_dl = torch.utils.data.DataLoader(
        ImageFolder(str(local), transform="eval"), **common, generator=torch.Generator().manual_seed(5)
    )
    ours_options = dict(cache_bytes=1 << 24, cache_dir=shm_dir, readahead=4)
    generator = torch.Generator().manual_seed(5)
    ours = DataLoader(ImageFolder(url, transform="eval"), **common, generator=generator, **ours_options)
    assert epochs(ours) == epochs(torch_dl)
    assert (ours.stats().misses, ours.stats().hits) == (18, 18)  # epoch 2 made no request


def test_a_missing_bucket_or_empty_prefix_is_named(server):
    with pytest.raises(SourceError, match=r"'s3://nowhere/x' cannot be listed: NoSuchBucket"):
        S3ImageFolderSource("s3://nowhere/x")
    boto3.client("s3").create_bucket(Bucket="empty")
    with pytest.raises(SourceError, match="holds no images in class folders"):
        S3ImageFolderSource("s3://empty/train")
    with pytest.raises(ValueError, match="s3://bucket/prefix, got 'data/train'"):
        S3ImageFolderSource("data/train")


def gone_mid_epoch(server, dataset, shm_dir: Path, index: int, named: str, workers: int = 2) -> None:
    """The server killed as an epoch starts: reading record ``index`` fails naming it (``named``), and the
    epoch skips every record, named, within a minute."""
    dl = DataLoader(
        dataset, batch_size=6, num_workers=workers, on_error="skip", cache_bytes=1 << 24, cache_dir=shm_dir
    )
    server.kill()
    server.wait()
    with pytest.raises(BadRecordError, match=named):
        dataset.source.read(index)
    start = time.monotonic()
    assert list(dl) == [] and dl.stats().records_skipped == 18
    assert time.monotonic() - start < 60


def stopped_read_fails(server, read, named: str) -> None:
    """The server stopped (SIGSTOP): ``read()`` fails within 10 s naming the record (``named``), no hang."""
    server.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(BadRecordError, match=named):
            read()
        assert time.monotonic() - start < 10
    finally:
        server.send_signal(signal.SIGCONT)


def test_a_server_gone_mid_epoch_names_the_object_and_nothing_hangs(bucket, server, shm_dir):
    url, _ = bucket
    dataset = ImageFolder(url, transform="eval")
    dataset.source.attempts = 1
    assert dataset.source.read(0)  # listed, one record read: the server goes as an epoch starts
    named = r"s3://data/train/class0/img001.jpg.*cannot read the object"
    gone_mid_epoch(server, dataset, shm_dir, 1, named, workers=0)


def test_a_stopped_server_is_a_timeout_that_names_the_object_not_a_hang(bucket, server):
    url, _ = bucket
    source = S3ImageFolderSource(url, attempts=1, timeout=1.0)
    assert source.read(0)
    stopped_read_fails(server, lambda: source.read(1), r"s3://data/train/class0/img001.jpg.*cannot read")
    assert source.read(1) == S3ImageFolderSource(url).read(1)  # it answers again once it runs


@pytest.fixture
def parquet(server, tmp_path) -> tuple[str, Path]:
    """``s3://data/train.parquet``: the images' bytes and labels in row groups of 5, and the local file."""
    local = make_jpeg_folder(tmp_path / "imgs", per_class=6, classes=3)
    paths = sorted(local.rglob("*.jpg"))
    table = pa.table(
        {"image": [p.read_bytes() for p in paths], "label": [int(p.parent.name[-1]) for p in paths]}
    )
    file = tmp_path / "train.parquet"
    pq.write_table(table, file, row_group_size=5)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="data")
    s3.put_object(Bucket="data", Key="train.parquet", Body=file.read_bytes())
    return "s3://data/train.parquet", file


def test_a_parquet_object_reads_as_the_local_file_through_our_cached_loader(parquet, shm_dir):
    url, local = parquet
    remote, here = ArrowSource(url, label_column="label"), ArrowSource(local, label_column="label")
    assert len(remote) == len(here) == 18 and remote.nbytes == here.nbytes
    assert [remote.read(i) for i in range(18)] == [here.read(i) for i in range(18)]
    assert [remote.label(i) for i in range(18)] == [here.label(i) for i in range(18)]
    assert remote.describe(3) == f"{url}:3"

    def epochs(dl) -> list:
        return [[(x.tolist(), y.tolist()) for x, y in dl] for _ in range(2)]

    common = dict(batch_size=4, shuffle=True, num_workers=2)
    torch_dl = torch.utils.data.DataLoader(
        ArrowDataset(str(local), label_column="label", transform="eval"),
        **common,
        generator=torch.Generator().manual_seed(5),
    )
    ours = DataLoader(
        ArrowDataset(url, label_column="label", transform="eval"),
        **common,
        generator=torch.Generator().manual_seed(5),
        cache_bytes=1 << 24,
        cache_dir=shm_dir,
    )
    assert epochs(ours) == epochs(torch_dl)
    assert (ours.stats().misses, ours.stats().hits) == (18, 18)  # epoch 2 made no request


def test_what_object_storage_cannot_serve_as_arrow_is_named(server, tmp_path):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="data")
    ipc = tmp_path / "t.arrow"
    with pa.ipc.new_file(ipc, pa.schema([("x", pa.binary())])) as writer:
        writer.write_table(pa.table({"x": [b"a"]}))
    s3.put_object(Bucket="data", Key="t.arrow", Body=ipc.read_bytes())
    with pytest.raises(SourceError, match=r"'s3://data/t.arrow' is not a Parquet file: .* only Parquet"):
        ArrowSource("s3://data/t.arrow")
    with pytest.raises(SourceError, match=r"'s3://data/missing.parquet' is not an object in the bucket"):
        ArrowSource("s3://data/missing.parquet")
    with pytest.raises(SourceError, match=r"'s3://data' names a bucket, not a file in it"):
        ArrowSource("s3://data")


def test_a_parquet_server_gone_mid_epoch_names_the_object_and_nothing_hangs(
    parquet, server, shm_dir, monkeypatch
):
    """Each read tries once here (forked workers inherit it): a gone server costs a refused connection, not
    the backoff of five attempts per record."""
    monkeypatch.setattr(_object_files, "ATTEMPTS", 1)
    url, _ = parquet
    dataset = ArrowDataset(url, label_column="label")  # its footer read, no row group yet
    gone_mid_epoch(server, dataset, shm_dir, 0, r"s3://data/train.parquet:0.*cannot read its row group")


def test_a_stopped_parquet_server_is_a_timeout_that_names_the_object(parquet, server, monkeypatch):
    monkeypatch.setattr(_object_files, "ATTEMPTS", 1)
    monkeypatch.setattr(_object_files, "TIMEOUT", 1.0)
    url, local = parquet
    source = ArrowSource(url)
    stopped_read_fails(
        server, lambda: source.read(7), r"s3://data/train.parquet:7.*cannot read its row group"
    )
    assert source.read(7) == ArrowSource(local).read(7)  # it answers again once it runs


@pytest.fixture
def shards(server, tmp_path) -> tuple[str, Path]:
    """``s3://data/shards/``: the image folder as tar shards of about 20 kB, and the local shards' folder."""
    local = image_folder_to_tar_shards(
        make_jpeg_folder(tmp_path / "imgs", per_class=6, classes=3), tmp_path / "shards", shard_bytes=20_000
    )
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="data")
    for path in local.shards:
        s3.put_object(Bucket="data", Key=f"shards/{Path(path).name}", Body=Path(path).read_bytes())
    s3.put_object(Bucket="data", Key="shards/README.txt", Body=b"not a shard")
    return "s3://data/shards/", tmp_path / "shards"


def test_tar_shards_in_object_storage_read_as_the_local_ones(shards, shm_dir):
    url, local = shards
    remote, here = TarShardsSource(url), TarShardsSource(local)
    assert len(remote.shards) == len(here.shards) > 1 and len(remote) == len(here) == 18
    assert [remote.read(i) for i in range(18)] == [here.read(i) for i in range(18)]
    assert [remote.label(i) for i in range(18)] == [here.label(i) for i in range(18)]
    assert remote.describe(0) == f"{remote.shards[0]}[00000000]" and remote.nbytes == here.nbytes
    assert TarShardsSource(remote.shards).fingerprint == remote.fingerprint

    def epochs(dl) -> list:
        return [[(x.tolist(), y.tolist()) for x, y in dl] for _ in range(2)]

    common = dict(batch_size=4, shuffle=True, num_workers=2)
    torch_dl = torch.utils.data.DataLoader(
        TarShards(str(local), transform="eval"), **common, generator=torch.Generator().manual_seed(5)
    )
    ours = DataLoader(
        TarShards(url, transform="eval"),
        **common,
        generator=torch.Generator().manual_seed(5),
        cache_bytes=1 << 24,
        cache_dir=shm_dir,
    )
    assert epochs(ours) == epochs(torch_dl)
    assert (ours.stats().misses, ours.stats().hits) == (18, 18)  # epoch 2 made no request


def test_tar_shards_in_object_storage_gone_or_missing_are_named(shards, server, monkeypatch, shm_dir):
    monkeypatch.setattr(_object_files, "ATTEMPTS", 1)
    url, _ = shards
    with pytest.raises(SourceError, match=r"'s3://data/none/' holds no .tar shards"):
        TarShardsSource("s3://data/none/")
    with pytest.raises(SourceError, match=r"'s3://data/shards/x.tar' is not an object in the bucket"):
        TarShardsSource("s3://data/shards/x.tar")
    named = r"s3://data/shards/shard-000000.tar\[00000000\].*cannot read"
    gone_mid_epoch(server, TarShards(url), shm_dir, 0, named)  # listed, nothing read yet


def test_without_boto3_the_location_and_the_missing_library_are_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 now raises ImportError
    with pytest.raises(SourceError, match=r"'s3://data/train': object storage is read with boto3"):
        S3ImageFolderSource("s3://data/train")


@pytest.mark.slow
def test_a_link_the_kernel_shapes_carries_the_records_at_its_rate(tmp_path, monkeypatch):
    """moto's server behind a veth pair with a token bucket (``shaped_s3``): our loader's epoch waits for the
    link, and the namespace and the pair are gone after."""
    local = make_jpeg_folder(tmp_path / "imgs", per_class=20, classes=2, size=(256, 256))
    with shaped_s3_server(rate_bits=8_000_000) as server:  # 1 MB/s
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="data")
        for path in local.rglob("*.jpg"):
            s3.put_object(Bucket="data", Key=f"train/{path.relative_to(local)}", Body=path.read_bytes())
        dataset = ImageFolder("s3://data/train", transform=None)
        start = time.perf_counter()
        got = sum(len(raw) for raw, _ in DataLoader(dataset, batch_size=None, num_workers=2))
        seconds = time.perf_counter() - start
    assert got == dataset.source.nbytes
    assert seconds >= 0.9 * got / 1e6  # no faster than the link
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"sb-s3-{os.getpid()}" not in listed
