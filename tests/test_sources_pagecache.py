"""drop_page_cache for real: after reads through each source, mincore shows the file's pages not resident."""

from __future__ import annotations

import os
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loader.sources import ArrowSource, ImageFolderSource, LMDBSource, image_folder_to_lmdb
from stallbench.storage import evict_page_cache, resident_bytes

RECORDS, RECORD_BYTES = 8, 1 << 20  # 8 MB in all


def _fs_type(path) -> str:
    """The type of the filesystem holding ``path``, from the longest matching mount point."""
    path, best = os.path.realpath(path), ("", "")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, mount, fstype, *_ = line.split()
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best[0]):
                best = (mount, fstype)
    return best[1]


@pytest.fixture
def disk(tmp_path):
    if _fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip(
            f"{tmp_path} is on {_fs_type(tmp_path)}, which keeps every page in memory and ignores fadvise"
        )
    return tmp_path


def payload(i: int) -> bytes:
    return bytes([i + 1]) * RECORD_BYTES


def image_files(root) -> list[str]:
    (root / "c").mkdir(parents=True)
    paths = [str(root / "c" / f"{i}.jpg") for i in range(RECORDS)]
    for i, path in enumerate(paths):
        with open(path, "wb") as f:
            f.write(payload(i))
    return paths


def residency_after_reads(make_source, files: list[str], drop: bool) -> float:
    """Evict ``files``, read every record through a fresh source, return the fraction of pages resident."""
    evict_page_cache(files)
    assert resident_bytes(files) == 0
    source = make_source()
    source.drop_page_cache = drop
    assert [source.read(i) for i in range(RECORDS)] == [payload(i) for i in range(RECORDS)]
    return resident_bytes(files) / sum(os.path.getsize(p) for p in files)


def test_resident_bytes_and_evict(disk):
    path = image_files(disk)[0]
    with open(path, "rb") as f:
        f.read()
    assert resident_bytes(path) == os.path.getsize(path)
    evict_page_cache(path)
    assert resident_bytes(path) == 0


def test_image_folder(disk):
    files = image_files(disk / "imgs")
    make = partial(ImageFolderSource, disk / "imgs")
    assert residency_after_reads(make, files, drop=True) == 0.0
    assert residency_after_reads(make, files, drop=False) == 1.0


def test_lmdb(disk):
    image_files(disk / "imgs")
    db = image_folder_to_lmdb(disk / "imgs", disk / "db").path
    files = [os.path.join(db, "data.mdb")]
    make = partial(LMDBSource, db)
    assert residency_after_reads(make, files, drop=True) < 0.01
    assert residency_after_reads(make, files, drop=False) > 0.95


@pytest.mark.parametrize("name", ["data.arrow", "data.parquet"])
def test_arrow_and_parquet(disk, name):
    path = str(disk / name)
    data = pa.table({"image": pa.array([payload(i) for i in range(RECORDS)], pa.binary())})
    if name.endswith(".parquet"):
        pq.write_table(data, path, row_group_size=2, compression="none")
    else:
        with pa.ipc.new_file(path, data.schema) as writer:
            writer.write_table(data, max_chunksize=3)
    make = partial(ArrowSource, path)
    assert residency_after_reads(make, [path], drop=True) < 0.01
    assert residency_after_reads(make, [path], drop=False) > 0.95
