"""CachedFiles: reads by path through the MinIO store, stale files, workers sharing it, validation."""

from __future__ import annotations

import errno
import hashlib
import multiprocessing as mp
import os
import pickle
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import loader.serving.held_reads
from loader import CachedFiles
from loader.cache._layout import index_bytes

FORK_WARNING = "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"
N, SIZE = 16, 4096


def stored(path) -> bytes:
    """The file's bytes as they are on storage now."""
    return Path(path).read_bytes()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def tree(tmp_path):
    """N files of SIZE random bytes in two folders: the paths in listing order."""
    paths = []
    for i in range(N):
        path = tmp_path / "data" / f"part{i % 2}" / f"{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(SIZE))
        paths.append(str(path))
    return tmp_path / "data", sorted(paths)


@pytest.fixture
def files(tree, shm_dir):
    made = CachedFiles(tree[0], index_bytes(N) + N // 2 * SIZE, cache_dir=shm_dir)  # room for half
    yield made
    made.close()


def data(files: CachedFiles, path) -> bytes | None:
    got = files.read(path)
    return None if got is None else got[0]


def test_second_pass_hits_exactly_the_files_admitted(tree, files):
    _, paths = tree
    first = {p: files.read(p) for p in paths}
    assert {p: (sha(raw), hit) for p, (raw, hit, _) in first.items()} == {
        p: (sha(stored(p)), False) for p in paths
    }
    cached = files._caches[0].info().records_cached
    assert cached == N // 2 == sum(got.admitted for got in first.values())
    second = [files.read(p) for p in paths]
    assert [sha(raw) for raw, _, _ in second] == [sha(first[p][0]) for p in paths]
    assert sum(hit for _, hit, _ in second) == cached
    assert not any(got.admitted for got in second)


def test_reads_held_for_admission_are_admitted_together_when_told(tree, files):
    _, paths = tree
    files.hold_admissions()
    first = [files.read(p) for p in paths + paths[:3]]  # three read again while held: from what is held
    assert [(sha(raw), hit, admitted) for raw, hit, admitted in first] == [
        (sha(stored(p)), k >= N, False) for k, p in enumerate(paths + paths[:3])
    ]
    assert files._caches[0].info().records_cached == 0
    assert files.admit_held() == N // 2 == files._caches[0].info().records_cached  # room for half
    second = [files.read(p) for p in paths]
    assert [sha(raw) for raw, _, _ in second] == [sha(stored(p)) for p in paths]
    assert [hit for _, hit, _ in second] == [True] * (N // 2) + [False] * (N // 2)
    assert not any(got.admitted for got in second[N // 2 :])  # not held any more: admitted at once, or not


def test_a_held_file_rewritten_in_the_batch_is_read_again_and_the_new_bytes_kept(tree, files):
    _, paths = tree
    files.hold_admissions()
    assert files.read(paths[0]).raw == stored(paths[0])
    Path(paths[0]).write_bytes(os.urandom(SIZE + 1))
    again = files.read(paths[0])
    assert (again.raw, again.hit) == (stored(paths[0]), False)
    assert files.admit_held() == 1 and files.read(paths[0]) == (stored(paths[0]), True, False)


def test_reads_held_past_held_bytes_are_admitted_at_once(tree, files, monkeypatch):
    _, paths = tree
    monkeypatch.setattr(loader.serving.held_reads, "HELD_BYTES", 2 * SIZE)
    files.hold_admissions()
    for k, path in enumerate(paths[:5]):
        files.read(path)
        assert files._caches[0].info().records_cached == (3 if k >= 2 else 0)
    assert files.admit_held() == 5 == files._caches[0].info().records_cached  # those at once counted too


def test_reads_held_from_many_threads_are_each_admitted_once(tree, files, monkeypatch):
    _, paths = tree
    monkeypatch.setattr(
        loader.serving.held_reads, "HELD_BYTES", 2 * SIZE
    )  # threads' reads taken while others add
    files.hold_admissions()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(files.read, paths * 4))
    assert [raw for raw, _, _ in got] == [stored(p) for p in paths * 4]
    assert files.admit_held() == files._caches[0].info().records_cached == N // 2  # room for half


def test_a_store_that_cannot_be_written_at_the_batch_s_end_is_turned_off_not_raised(tree, files, monkeypatch):
    _, paths = tree

    def broken(*args):
        raise OSError(errno.EIO, "I/O error")

    files.hold_admissions()
    assert [files.read(p).raw for p in paths[:3]] == [stored(p) for p in paths[:3]]
    monkeypatch.setattr(os, "pwritev", broken)
    with pytest.warns(RuntimeWarning, match="cannot be used in this process"):
        assert files.admit_held() == 0
    assert [files.read(p) for p in paths[:3]] == [(stored(p), False, False) for p in paths[:3]]


def test_a_file_changed_after_the_listing_is_read_from_storage(tree, files):
    _, paths = tree
    for p in paths:
        files.read(p)
    with open(paths[0], "wb") as f:  # cached, and now a different size
        f.write(b"new bytes")
    assert files.read(paths[0]) == (b"new bytes", False, False)
    st = os.stat(paths[1])  # cached, same size, later mtime
    with open(paths[1], "r+b") as f:
        f.write(b"\0" * 8)
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    raw, hit, _ = files.read(paths[1])
    assert raw[:8] == b"\0" * 8 and not hit
    os.unlink(paths[2])
    assert files.read(paths[2]) is None  # gone: the caller's own open says so


def test_paths_not_listed_are_not_served(tree, files, tmp_path, monkeypatch):
    root, _ = tree
    (tmp_path / "elsewhere").write_bytes(b"x")
    (root / ".hidden").write_bytes(b"h")
    for path in (tmp_path / "elsewhere", root / ".hidden", root / "part0", root, "/etc/hostname"):
        assert files.read(path) is None
    assert files.read(root / "part0" / "nope.bin") is None
    monkeypatch.chdir(root)
    assert files.read(os.path.join("part1", "001.bin"))[:2] == (stored(root / "part1" / "001.bin"), False)
    assert data(files, b"part1/../part1/001.bin") == stored(root / "part1" / "001.bin")
    for unusual in ("part1//001.bin", "./part1/./001.bin", f"{os.sep}{root}/part1/001.bin"):
        assert data(files, os.path.join(root, unusual)) == stored(root / "part1" / "001.bin"), unusual


def test_links_inside_the_tree_resolve_to_the_listed_file(tree, files, tmp_path):
    root, paths = tree
    (root / "alias").symlink_to(root / "part0")
    (tmp_path / "data2").symlink_to(root)
    (tmp_path / "out").write_bytes(b"secret")
    (root / "out").symlink_to(tmp_path / "out")  # leads out of the tree: not ours
    assert files.read(root / "alias" / "000.bin") == (stored(paths[0]), False, True)
    assert files.read(tmp_path / "data2" / "part0" / "000.bin") == (stored(paths[0]), True, False)  # one file
    assert files.read(root / "out") is None


def test_pickled_copies_share_the_store(tree, files):
    _, paths = tree
    copy = pickle.loads(pickle.dumps(files))
    reads = [(copy.read(p), files.read(p)) for p in paths]
    assert all(theirs[0] == ours[0] == stored(p) for (theirs, ours), p in zip(reads, paths, strict=True))
    assert sum(ours[1] for _, ours in reads) == N // 2  # what the copy admitted, the original hits
    copy.close()


def test_a_copy_whose_store_is_gone_reads_from_storage(tree, files):
    """A worker that cannot attach the store (removed, replaced) reads every file from storage."""
    _, paths = tree
    [files.read(p) for p in paths]
    store = files.infos()[0].path
    pickled = pickle.dumps(files)
    shutil.rmtree(store)
    with pytest.warns(RuntimeWarning, match="cannot be used in this process"):
        copy = pickle.loads(pickled)
        assert [copy.read(p) for p in paths] == [(stored(p), False, False) for p in paths]
    copy.close()


def test_several_roots_split_the_capacity_by_size(tmp_path, shm_dir):
    for name, size in (("small", 1000), ("big", 3000)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_bytes(b"s" * size)
    budget = index_bytes(1) * 2 + 8000
    files = CachedFiles([tmp_path / "small", str(tmp_path / "big"), tmp_path / "small"], budget, shm_dir)
    try:
        assert [len(s) for s in files.sources] == [1, 1]  # the same root given twice counts once
        assert [c.capacity - index_bytes(1) for c in files._caches] == [2000, 6000]
        assert data(files, tmp_path / "big" / "f") == b"s" * 3000
    finally:
        files.close()


def test_auto_capacity_holds_a_small_tree(tree, shm_dir):
    files = CachedFiles([tree[0]], "auto", shm_dir)
    try:
        assert files._caches[0].capacity == index_bytes(N) + N * SIZE
        assert "dataset's size" in files.cache_sizing
    finally:
        files.close()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "big", None])
def test_cache_bytes_must_be_a_positive_int_or_auto(tree, shm_dir, bad):
    message = f"cache_bytes must be a positive number of bytes or 'auto', got {bad!r}"
    with pytest.raises(ValueError, match=re.escape(message)):
        CachedFiles(tree[0], bad, shm_dir)


def test_files_larger_than_largest_are_not_served(tree, shm_dir):
    files = CachedFiles(tree[0], 1 << 20, shm_dir, largest=SIZE - 1)
    try:
        assert [files.read(p) for p in tree[1]] == [None] * N
    finally:
        files.close()
    for bad in (0, 1 << 32, True, 1.0):
        with pytest.raises(
            ValueError, match=re.escape(f"largest must be a number of bytes from 1 to 2**32 - 1, got {bad!r}")
        ):
            CachedFiles(tree[0], 1 << 20, shm_dir, largest=bad)


def test_bad_roots_are_named(tree, shm_dir, tmp_path):
    with pytest.raises(ValueError, match="cannot hold even the index of the 16 files"):
        CachedFiles(tree[0], index_bytes(N), shm_dir)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "missing"))):
        CachedFiles([tree[0], tmp_path / "missing"], 1 << 20, shm_dir)
    with pytest.raises(ValueError, match="at least one"):
        CachedFiles([], 1 << 20, shm_dir)
    with pytest.raises(ValueError, match=re.escape(f"root {str(tree[0] / 'part0')!r} lies inside")):
        CachedFiles([tree[0], tree[0] / "part0"], 1 << 20, shm_dir)
    assert not any(p.name.startswith("minio-") for p in shm_dir.rglob("*"))  # no store made


def _read_all(files: CachedFiles, paths: list[str]) -> None:
    for p in paths:
        assert data(files, p) == stored(p)


@pytest.mark.multiproc
@pytest.mark.filterwarnings(FORK_WARNING)
def test_forked_processes_fill_one_store(tree, files):
    _, paths = tree
    _read_all(files, paths[:4])
    ctx = mp.get_context("fork")
    workers = [ctx.Process(target=_read_all, args=(files, paths[k::2])) for k in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    assert files._caches[0].info().records_cached == N // 2
    assert sum(files.read(p)[1] for p in paths) == N // 2  # what the children admitted, this one hits
