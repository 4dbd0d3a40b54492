"""ImageFolderSource: listing, reads, labels, fingerprint, pickling, fork and errors."""

from __future__ import annotations

import os
import pickle
import re

import pytest
from _data import jpeg_bytes, make_image_folder, read_in_fork

from loader.errors import BadRecordError, SourceError
from loader.sources import ImageFolderSource

FORK_WARNING = "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "imgs"
    return root, make_image_folder(root, {"dog": 3, "cat": 2})


def test_reads_bytes_and_labels_in_class_then_name_order(folder):
    root, records = folder
    source = ImageFolderSource(root)
    assert len(source) == 5
    assert source.classes == ["cat", "dog"]
    assert [source.read(i) for i in range(5)] == [data for data, _ in records]
    assert [source.label(i) for i in range(5)] == [0, 0, 1, 1, 1]
    assert source.describe(2) == os.path.join(root, "dog", "img0.jpg")
    assert source.read(-1) == records[-1][0]
    assert source.nbytes == sum(len(data) for data, _ in records)


def test_extensions_case_insensitive_and_hidden_and_other_files_skipped(tmp_path):
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    for name in ("x.JPEG", "y.Png", "notes.txt", ".z.jpg", "sub/w.jpg"):
        (tmp_path / "a" / name).write_bytes(jpeg_bytes(1))
    (tmp_path / ".hidden" / "h.jpg").write_bytes(jpeg_bytes(2))
    source = ImageFolderSource(tmp_path)
    assert source.classes == ["a"]
    assert [os.path.relpath(source.describe(i), tmp_path) for i in range(len(source))] == [
        "a/sub/w.jpg",
        "a/x.JPEG",
        "a/y.Png",
    ]


def test_out_of_range_index(folder):
    with pytest.raises(IndexError, match="7"):
        ImageFolderSource(folder[0]).read(7)


def test_fingerprint_follows_the_names_and_identity_the_content(folder):
    root, _ = folder
    base = ImageFolderSource(root).fingerprint
    assert ImageFolderSource(root).fingerprint == base
    (root / "cat" / "new.jpg").write_bytes(jpeg_bytes(9))
    added = ImageFolderSource(root).fingerprint
    (root / "cat" / "new.jpg").unlink()
    assert ImageFolderSource(root).fingerprint == base  # the same files
    before = ImageFolderSource(root).identity(0)
    (root / "cat" / "img0.jpg").write_bytes(jpeg_bytes(5, size=(20, 20)))
    changed = ImageFolderSource(root)
    assert changed.fingerprint == base and changed.identity(0) != before
    (root / "dog" / "img1.jpg").unlink()
    removed = ImageFolderSource(root).fingerprint
    assert len({base, added, removed}) == 3


def test_pickle_round_trip(folder):
    root, records = folder
    source = ImageFolderSource(root)
    copy = pickle.loads(pickle.dumps(source))
    assert len(copy) == len(source)
    assert copy.fingerprint == source.fingerprint
    assert [copy.read(i) for i in range(len(copy))] == [data for data, _ in records]


@pytest.mark.multiproc
@pytest.mark.filterwarnings(FORK_WARNING)
def test_read_in_forked_child(folder):
    root, records = folder
    source = ImageFolderSource(root)
    source.read(0)
    assert read_in_fork(source, [4, 0]) == [records[4][0], records[0][0]]


def test_missing_root(tmp_path):
    with pytest.raises(SourceError, match=re.escape(str(tmp_path / "nope"))):
        ImageFolderSource(tmp_path / "nope")


def test_no_class_folders(tmp_path):
    (tmp_path / "loose.jpg").write_bytes(jpeg_bytes(0))
    with pytest.raises(SourceError, match=re.escape(str(tmp_path)) + ".*no class folders"):
        ImageFolderSource(tmp_path)


def test_no_image_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "readme.txt").write_text("hi")
    with pytest.raises(SourceError, match=re.escape(str(tmp_path)) + ".*no image files"):
        ImageFolderSource(tmp_path)


def test_vanished_file_names_path_and_index(folder):
    root, _ = folder
    source = ImageFolderSource(root)
    (root / "dog" / "img1.jpg").unlink()
    path = re.escape(str(root / "dog" / "img1.jpg"))
    with pytest.raises(BadRecordError, match=f"record 3 \\({path}\\)") as info:
        source.read(3)
    assert (info.value.index, info.value.where) == (3, str(root / "dog" / "img1.jpg"))


@pytest.mark.slow
def test_lists_20k_files(tmp_path):
    (tmp_path / "one.jpg").touch()  # hard links: creating 20k inodes is slow on some filesystems
    for c in range(20):
        (tmp_path / f"c{c:02d}").mkdir()
        for k in range(1000):
            os.link(tmp_path / "one.jpg", tmp_path / f"c{c:02d}" / f"{k:04d}.jpg")
    source = ImageFolderSource(tmp_path)
    assert len(source) == 20_000 and source.label(19_999) == 19
    assert source.describe(19_999) == str(tmp_path / "c19" / "0999.jpg")
