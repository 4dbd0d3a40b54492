"""FileTreeSource: listing and order, links, lookups, fingerprint, page-cache eviction and bad roots; its
compact path index and the listing shared within a process."""

from __future__ import annotations

import gc
import os
import pickle
import re
import shutil
import tracemalloc

import pytest

from loader import FileTreeSource
from loader.errors import BadRecordError, SourceError
from loader.sources import _path_index
from loader.sources._file_records import file_identity
from loader.sources._listing import scanned
from loader.sources._path_index import PathIndex
from loader.sources.file_tree import shared_listing
from stallbench.conditions.storage import evict_page_cache, resident_bytes

FILES = {"b.bin": b"bb", "a/z.npy": b"z" * 10, "a/sub/y.jpg": b"yy", "a.b/x": b"x", "c": b""}


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    for rel, data in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_lists_every_regular_file_sorted_by_relative_path(tree):
    source = FileTreeSource(tree)
    rels = [os.path.relpath(source.describe(i), tree) for i in range(len(source))]
    assert rels == sorted(FILES) == ["a.b/x", "a/sub/y.jpg", "a/z.npy", "b.bin", "c"]
    assert [source.read(i) for i in range(len(source))] == [FILES[r] for r in rels]
    assert [source.label(i) for i in range(len(source))] == [0] * len(FILES)
    assert source.nbytes == sum(map(len, FILES.values()))
    assert source.identity(2) == file_identity(os.stat(tree / "a/z.npy")) != 0
    assert source.thread_safe_reads


def test_hidden_entries_and_links_are_not_listed(tree, tmp_path):
    (tree / ".hidden").write_bytes(b"h")
    (tree / ".git").mkdir()
    (tree / ".git" / "HEAD").write_bytes(b"h")
    (tmp_path / "outside").write_bytes(b"secret")
    (tree / "out").symlink_to(tmp_path / "outside")  # would lead out of the tree
    (tree / "dup").symlink_to(tree / "a")  # would list a/ twice
    (tree / "loop").symlink_to(tree)
    source = FileTreeSource(tree)
    assert len(source) == len(FILES)
    assert source.find(str(tree / "out")) is None
    assert source.find(str(tree / "dup" / "z.npy")) is None  # CachedFiles resolves it by its real path


def test_find_by_path_and_through_a_linked_root(tree, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tree)
    source = FileTreeSource(link)
    i = source.find(str(link / "a" / "z.npy"))
    assert source.read(i) == FILES["a/z.npy"]
    assert source.find(str(tree / "a" / "z.npy")) == i  # the real path of the same file
    assert source.find(str(link / "a")) is None  # a folder
    assert source.find(str(link / "a" / "z.np")) is None
    assert source.find(str(link) + "x/b.bin") is None  # a sibling whose name starts like the root


def test_a_file_root_is_one_record(tree):
    source = FileTreeSource(tree / "a" / "z.npy")
    assert len(source) == 1
    assert source.describe(0) == str(tree / "a" / "z.npy")
    assert source.find(str(tree / "a" / "z.npy")) == 0
    assert source.find(str(tree / "b.bin")) is None
    assert source.read(0) == FILES["a/z.npy"]


def test_a_deep_tree_is_listed_in_the_order_and_with_the_fingerprint_of_its_sorted_paths(tmp_path):
    # the scan sorts one folder at a time: names that sort around the separator ("a-b", "a.c", "a0" beside
    # the folder "a") and a deep tree must still give the order of the whole relative paths, sorted
    names = ["a-b/1", "a.c", "a/b/c/d/2", "a/b-c/3", "a/b.c", "a/b0/4", "a0", "\udcff/5", "z/y/x/6"]
    for i, rel in enumerate(names):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"r" * i)
    source = FileTreeSource(tmp_path)
    paths = sorted(names)
    assert [os.path.relpath(source.describe(i), tmp_path) for i in range(len(source))] == paths
    assert source.nbytes == sum(range(len(names)))
    assert (
        source.fingerprint == scanned("file-tree", str(tmp_path), [(paths, 0)], None, {}, False).fingerprint
    )


def test_fingerprint_changes_with_the_tree_and_a_file_s_identity_with_its_content(tree, tmp_path):
    base = FileTreeSource(tree).fingerprint
    assert FileTreeSource(tree).fingerprint == base
    (tree / "new").write_bytes(b"n")
    added = FileTreeSource(tree).fingerprint
    (tree / "new").unlink()
    assert FileTreeSource(tree).fingerprint == base
    target = tree / "a" / "z.npy"
    before = FileTreeSource(tree).identity(2)
    target.write_bytes(b"longer than before")
    rewritten = FileTreeSource(tree).identity(2)
    st = os.stat(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched = FileTreeSource(tree).identity(2)
    target.chmod(0o600)  # the same bytes: its records stay served
    assert FileTreeSource(tree).fingerprint == base and len({before, rewritten, touched}) == 3
    assert FileTreeSource(tree).identity(2) == touched
    (tree / "b.bin").rename(tree / "b2.bin")
    renamed = FileTreeSource(tree).fingerprint
    shutil.copytree(tree, tmp_path / "copy")
    elsewhere = FileTreeSource(tmp_path / "copy").fingerprint  # the same names in another place
    assert len({base, added, renamed, elsewhere}) == 4


def test_pickle_round_trip(tree):
    source = FileTreeSource(tree)
    copy = pickle.loads(pickle.dumps(source))
    assert copy.fingerprint == source.fingerprint
    assert [copy.read(i) for i in range(len(copy))] == [source.read(i) for i in range(len(source))]
    assert copy.find(str(tree / "c")) == source.find(str(tree / "c")) == 4


@pytest.mark.parametrize("make", ["missing", "empty", "hidden only"])
def test_bad_roots_name_the_root(tmp_path, make):
    root = tmp_path / "root"
    if make != "missing":
        root.mkdir()
    if make == "hidden only":
        (root / ".x").write_bytes(b"x")
        (root / "sub").mkdir()
    with pytest.raises(ValueError, match=re.escape(str(root))) as info:
        FileTreeSource(root)
    assert isinstance(info.value, SourceError)


def test_index_errors_and_a_vanished_file(tree):
    source = FileTreeSource(tree)
    with pytest.raises(IndexError, match="9"):
        source.read(9)
    (tree / "b.bin").unlink()
    with pytest.raises(BadRecordError, match=re.escape(str(tree / "b.bin"))):
        source.read(3)
    with pytest.raises(BadRecordError, match=re.escape(str(tree / "b.bin"))):
        source.read_admitting(3, lambda raw, ours: True)


@pytest.mark.parametrize(
    ("admit", "warm", "ours", "left"),
    [(True, False, True, 0.0), (False, False, True, 1.0), (True, True, False, 1.0)],
)
def test_evicts_only_admitted_files_read_cold_and_only_when_asked(tmp_path, admit, warm, ours, left):
    """A read that brought the file in says ``ours``; nothing goes at admission; ``evict`` (the loader's
    call at the record's first hit) takes a file admitted by such a read, and nothing else."""
    files = []
    for i in range(4):
        files.append(str(tmp_path / f"{i}.npy"))
        with open(files[-1], "wb") as f:
            f.write(bytes([i + 1]) * (1 << 20))
    evict_page_cache(files)
    if resident_bytes(files) != 0:
        pytest.skip(f"{tmp_path} keeps its pages in memory (tmpfs?): nothing to evict")
    if warm:  # another job's pages: they stay
        for path in files:
            with open(path, "rb") as f:
                f.read()
    source = FileTreeSource(tmp_path)
    offered = []
    got = [source.read_admitting(i, lambda raw, mine: offered.append(mine) or admit) for i in range(4)]
    assert got == [(bytes([i + 1]) * (1 << 20), admit) for i in range(4)]
    assert offered == [ours] * 4 and resident_bytes(files) == 4 << 20
    for i in range(4):
        if admit and offered[i]:
            source.evict(i)
    assert resident_bytes(files) / (4 << 20) == left


def test_path_index_finds_every_path_and_only_those():
    paths = sorted([f"{d}/{i:05d}.jpg" for d in range(10) for i in range(300)] + ["\udcff.bin", "é/ü"])
    index = PathIndex(paths)
    assert len(index) == len(paths)
    assert [index[i] for i in range(len(paths))] == paths
    assert [index.find(p) for p in paths] == list(range(len(paths)))
    for absent in ("", "0", "0/00000.jp", "9/00300.jpg", "\ud800"):
        assert index.find(absent) is None
    copy = pickle.loads(pickle.dumps(index))
    assert [copy.find(p) for p in paths] == list(range(len(paths)))
    kept = PathIndex.from_parts(*index.parts())  # a listing read back: its buckets made again
    assert [kept.find(p) for p in paths] == list(range(len(paths)))
    assert kept.find("9/00300.jpg") is None


def test_path_index_tells_paths_with_one_hash_apart(monkeypatch):
    monkeypatch.setattr(_path_index, "_digest", lambda encoded: b"\7" * 8)
    paths = ["a", "b", "c/d", "e"]
    index = PathIndex(paths)
    assert [index.find(p) for p in paths] == [0, 1, 2, 3]
    assert index.find("f") is None


def test_a_path_index_built_without_lookups_holds_the_paths_and_refuses_a_lookup():
    paths = [f"{d}/{i:05d}.jpg" for d in range(3) for i in range(5000)]  # more than one chunk
    index = PathIndex(paths, searchable=False)
    assert [index[i] for i in range(len(paths))] == paths
    assert not index.searchable and PathIndex(paths).searchable
    with pytest.raises(TypeError, match="searchable=False"):
        index.find(paths[0])


def test_path_index_holds_no_python_object_per_path():
    paths = [f"train/{d}/{i:05d}.jpg" for d in range(10) for i in range(2000)]
    tracemalloc.start()
    try:
        index = PathIndex(paths)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert index.find(paths[-1]) == len(paths) - 1
    names = sum(map(len, paths))  # the paths' own bytes; a list of str adds ~57 per path
    assert held - names < 32 * len(paths), f"{(held - names) / len(paths):.0f} bytes per path over its name"


def test_shared_listing_is_one_listing_while_held(tree):
    first = shared_listing(tree)
    assert shared_listing(str(tree) + "/") is first
    (tree / "new.bin").write_bytes(b"n")
    assert shared_listing(tree).find(str(tree / "new.bin")) is None  # listed once: not listed again
    fingerprint = first.fingerprint
    del first
    gc.collect()
    fresh = shared_listing(tree)
    assert fresh.find(str(tree / "new.bin")) is not None and fresh.fingerprint != fingerprint
