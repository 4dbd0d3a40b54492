"""Page-cache eviction for real (mincore): a read tells whether it brought every page of its record in
(``ours``); nothing is evicted at admission; ``evict`` then evicts those pages, and no other. A cold file
the cache takes is read around the page cache, and a warm one never is."""

from __future__ import annotations

import gc
import os
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loader.cache.minio import TAKES_AHEAD
from loader.serving.files import CachedFiles
from loader.sources import ArrowSource, ImageFolderSource, LMDBSource, image_folder_to_lmdb
from loader.system import pagecache as _pagecache
from loader.system.libc import cached_pages
from loader.system.pagecache import PAGE
from stallbench.conditions.storage import evict_page_cache, resident_bytes

RECORDS, RECORD_BYTES = 8, 1 << 20  # 8 MB in all


@pytest.fixture(params=["cachestat", "mincore", "nowait"])
def residency(request, monkeypatch) -> str:
    """How what was resident before a read is learned: ``cachestat`` (this kernel has it), ``mincore`` (a
    kernel without it; this user owns the file), or where the kernel would tell neither truthfully, the
    ``RWF_NOWAIT`` probe."""
    if request.param != "cachestat":
        monkeypatch.setattr(_pagecache, "cached_pages", lambda fd, offset, length: None)
    if request.param == "nowait":
        monkeypatch.setattr(_pagecache, "can_tell", lambda fd: False)
    return request.param


def payload(i: int) -> bytes:
    return bytes([i + 1]) * RECORD_BYTES


def image_files(root) -> list[str]:
    (root / "c").mkdir(parents=True)
    paths = [str(root / "c" / f"{i}.jpg") for i in range(RECORDS)]
    for i, path in enumerate(paths):
        with open(path, "wb") as f:
            f.write(payload(i))
    return paths


def residency_after_reads(
    make_source, files: list[str], admit: bool, warm: bool = False, takes: bool | None = None
) -> tuple:
    """Evict ``files`` (or read them first with ``warm``), read every record through a fresh source with
    ``read_admitting`` (the cache saying it ``takes`` each, where not None); then ``evict`` each record
    admitted by a read that said ``ours`` (as the loader does at its first hit). Returns (the ``ours`` of
    each read, the fraction of the files' pages resident after the reads, and after the evictions)."""
    evict_page_cache(files)
    assert resident_bytes(files) == 0
    if warm:
        for path in files:
            with open(path, "rb") as f:
                f.read()
    source = make_source()
    offered = []
    asked = None if takes is None else lambda nbytes: nbytes == RECORD_BYTES and takes
    got = [
        source.read_admitting(i, lambda raw, ours: offered.append((raw, ours)) or admit, asked)
        for i in range(RECORDS)
    ]
    assert got == [(payload(i), admit) for i in range(RECORDS)]
    assert [raw for raw, _ in offered] == [payload(i) for i in range(RECORDS)]
    size = sum(os.path.getsize(p) for p in files)
    after_reads = resident_bytes(files) / size
    for i, (_, ours) in enumerate(offered):
        if admit and ours:
            source.evict(i)
    after_evictions = resident_bytes(files) / size
    del source, got
    gc.collect()  # a mapping left to a later collection keeps its pages: the next call could not evict them
    # to a hundredth: a page or two the kernel reclaims meanwhile (other work's memory: 1 of 2,048 pages was,
    # once in a suite run) is not what the test tells apart (all of the data, or none of it)
    return [ours for _, ours in offered], round(after_reads, 2), round(after_evictions, 2)


def test_resident_bytes_and_evict(disk):
    path = image_files(disk)[0]
    with open(path, "rb") as f:
        f.read()
    assert resident_bytes(path) == os.path.getsize(path)
    evict_page_cache(path)
    assert resident_bytes(path) == 0


def test_image_folder_evicts_admitted_records_read_cold_only_when_asked(disk, residency):
    files = image_files(disk / "imgs")
    make = partial(ImageFolderSource, disk / "imgs")
    assert residency_after_reads(make, files, admit=True) == ([True] * RECORDS, 1.0, 0.0)
    assert residency_after_reads(make, files, admit=False) == ([True] * RECORDS, 1.0, 1.0)
    # another job's warm pages: not ours, never evicted
    assert residency_after_reads(make, files, admit=True, warm=True) == ([False] * RECORDS, 1.0, 1.0)


def test_a_cold_file_the_cache_takes_is_read_around_the_page_cache_and_a_warm_one_never(disk, residency):
    files = image_files(disk / "imgs")
    make = partial(ImageFolderSource, disk / "imgs")
    # where only the RWF_NOWAIT probe can tell, it started readahead: read through the page cache
    around = ([True] * RECORDS, 1.0, 0.0) if residency == "nowait" else ([False] * RECORDS, 0.0, 0.0)
    assert residency_after_reads(make, files, admit=True, takes=True) == around
    # the cache would not keep them: read through the page cache, which keeps them as for torch's loader
    assert residency_after_reads(make, files, admit=False, takes=False) == ([True] * RECORDS, 1.0, 1.0)
    warm = residency_after_reads(make, files, admit=True, warm=True, takes=True)
    assert warm == ([False] * RECORDS, 1.0, 1.0)


def test_a_users_file_read_through_cached_files_is_held_once(disk, shm_dir):
    files = image_files(disk / "imgs")
    evict_page_cache(files)
    cached = CachedFiles(disk / "imgs", (RECORDS + TAKES_AHEAD) * RECORD_BYTES, shm_dir)  # room ahead
    try:
        assert [cached.read(path) for path in files] == [(payload(i), False, True) for i in range(RECORDS)]
        assert resident_bytes(files) == 0 and cached.infos()[0].records_cached == RECORDS
        assert [cached.read(path) for path in files] == [(payload(i), True, False) for i in range(RECORDS)]
    finally:
        cached.close()


def read_pages(path: str, pages: list[int]) -> None:
    """Bring exactly these pages of ``path`` into the page cache, and no other."""
    evict_page_cache(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: exactly one page per read
        for page in pages:
            os.pread(fd, PAGE, page * PAGE)
    finally:
        os.close(fd)
    assert resident_bytes(path) == len(pages) * PAGE


def test_a_read_that_found_pages_resident_is_not_ours(disk, residency):
    """A file whose first page alone was resident: the read is not ours, and every page stays."""
    path = image_files(disk / "imgs")[0]
    read_pages(path, [0])
    offered = []
    raw, admitted = ImageFolderSource(disk / "imgs").read_admitting(
        0, lambda raw, ours: offered.append(ours) or True
    )
    assert (raw, admitted, offered) == (payload(0), True, [False])
    assert resident_bytes(path) == RECORD_BYTES


def test_pages_resident_anywhere_in_the_file_make_the_read_not_ours(disk):
    """mincore and cachestat count each page: pages resident mid-file before the read make it not ours.
    (The RWF_NOWAIT probe sees only a resident prefix: with it, such a read would be ours.)"""
    path = image_files(disk / "imgs")[0]
    read_pages(path, [5, 6, 100])
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _pagecache.resident_pages(fd, RECORD_BYTES).nonzero()[0].tolist() == [5, 6, 100]
        assert _pagecache.resident_count(fd, RECORD_BYTES) == 3
        assert cached_pages(fd, 6 * PAGE, 95 * PAGE) == 2  # pages 6 to 100: a range is counted alone
        assert cached_pages(fd, 0, 0) is None
    finally:
        os.close(fd)
    offered = []
    raw, admitted = ImageFolderSource(disk / "imgs").read_admitting(
        0, lambda raw, ours: offered.append(ours) or True
    )
    assert (raw, admitted, offered) == (payload(0), True, [False])


def test_evict_file_evicts_the_whole_file_and_leaves_a_missing_one_alone(disk):
    path = image_files(disk / "imgs")[0]
    evict_page_cache(path)  # written back: fadvise evicts no dirty page
    with open(path, "rb") as f:
        f.read()
    assert resident_bytes(path) == RECORD_BYTES
    _pagecache.evict_file(path)
    assert resident_bytes(path) == 0
    _pagecache.evict_file(str(disk / "imgs" / "gone.jpg"))  # no error


def test_a_failed_admission_keeps_the_pages_and_a_plain_read_evicts_nothing(disk):
    files = image_files(disk / "imgs")
    evict_page_cache(files)
    source = ImageFolderSource(disk / "imgs")
    assert [source.read(i) for i in range(RECORDS)] == [payload(i) for i in range(RECORDS)]
    assert resident_bytes(files) == sum(os.path.getsize(p) for p in files)


def test_lmdb_never_evicts(disk):
    """py-lmdb faults a value in before the source sees it: what was resident is unknown, so none goes."""
    image_files(disk / "imgs")
    db = image_folder_to_lmdb(disk / "imgs", disk / "db").path
    files = [os.path.join(db, "data.mdb")]
    make = partial(LMDBSource, db)
    for admit in (True, False):
        ours, after_reads, after_evictions = residency_after_reads(make, files, admit=admit)
        assert ours == [False] * RECORDS and after_reads > 0.95 and after_evictions > 0.95


def _arrow_file(disk, name: str) -> str:
    path = str(disk / name)
    data = pa.table({"image": pa.array([payload(i) for i in range(RECORDS)], pa.binary())})
    if name.endswith(".parquet"):
        pq.write_table(data, path, row_group_size=2, compression="none")
    else:
        with pa.ipc.new_file(path, data.schema) as writer:
            writer.write_table(data, max_chunksize=3)
    return path


def test_arrow_ipc_evicts_admitted_records_read_cold_only_when_asked(disk):
    path = _arrow_file(disk, "data.arrow")
    make = partial(ArrowSource, path)
    ours, after_reads, after_evictions = residency_after_reads(make, [path], admit=True)
    assert ours == [True] * RECORDS and after_reads > 0.95 and after_evictions < 0.01
    ours, after_reads, after_evictions = residency_after_reads(make, [path], admit=False)
    assert ours == [True] * RECORDS and after_reads > 0.95 and after_evictions > 0.95
    assert residency_after_reads(make, [path], admit=True, warm=True) == ([False] * RECORDS, 1.0, 1.0)


def test_parquet_never_evicts(disk):
    """A row group is read whole, with other records in it: its pages are left to the kernel."""
    path = _arrow_file(disk, "data.parquet")
    ours, after_reads, after_evictions = residency_after_reads(partial(ArrowSource, path), [path], admit=True)
    assert ours == [False] * RECORDS and after_reads > 0.95 and after_evictions > 0.95


@pytest.mark.parametrize("told", [0, 10, 3 << 20, 8 << 20], ids=["empty", "short", "exact", "long"])
def test_a_file_is_read_to_its_end_whatever_size_its_fstat_told(tmp_path, told):
    """A file grown since its fstat (told less) or shrunk (told more) is read whole, as FileIO.readall."""
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(3 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _pagecache._read_to_end(fd, told) == path.read_bytes()
    finally:
        os.close(fd)
