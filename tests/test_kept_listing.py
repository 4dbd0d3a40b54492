"""A folder's listing kept for the next run: read back in a new process without a scan while the tree's
folders are unchanged, listed again when a file is added, removed or renamed or a folder replaced, never
believed when damaged or not ours; a file rewritten in place is read from storage, not served stale."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from _data import jpeg_bytes, make_image_folder

import loader
from loader import sources
from loader.sources import FileTreeSource, ImageFolderSource, _listing
from loader.sources._kept_listing import MAGIC, listing_name, listings_folder

LISTED = """
import json, sys
from loader.sources import _listing
from loader.sources import {cls}
if sys.argv[2] == "kept":  # a scan would enter a folder
    def refuse(self, rel):
        raise AssertionError(f"scanned {{rel!r}}")
    _listing.Folders.entries = refuse
source = {cls}(sys.argv[1])
print(json.dumps([source.fingerprint, [source.describe(i) for i in range(len(source))],
                  source.nbytes, getattr(source, "classes", None)]))
"""


PAST = time.time_ns() - 10 * 10**9


def _settle(root, past: int = PAST) -> None:
    """Every folder's mtime set to ``past``, as a tree made before this run has (its ctime, which no one
    can set, left a tick behind)."""
    for folder, _, _ in os.walk(root):
        os.utime(folder, ns=(past, past))
    time.sleep(0.15)


def _listed(cls: str, root, how: str = "scan") -> list:
    """``cls(root)``'s fingerprint, paths, bytes and classes; ``how="kept"`` fails it with the scan's
    AssertionError if the tree is scanned (the kept listing not believed)."""
    with pytest.MonkeyPatch.context() as patch:
        if how == "kept":
            patch.setattr(_listing.Folders, "entries", _refuse)
        source = getattr(sources, cls)(root)
    paths = [source.describe(i) for i in range(len(source))]
    return [source.fingerprint, paths, source.nbytes, getattr(source, "classes", None)]


def _refuse(folders, rel: str) -> None:
    raise AssertionError(f"scanned {rel!r}")


def _listed_in_a_new_process(cls: str, root, how: str = "scan") -> list:
    """``_listed`` in a new process, as a job's next run lists."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LISTED.format(cls=cls)), str(root), how],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode:
        raise AssertionError(out.stderr)
    return json.loads(out.stdout)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "imgs"
    make_image_folder(root, {"dog": 3, "cat": 2})
    (root / "dog" / "sub").mkdir()
    (root / "dog" / "sub" / "deep.jpg").write_bytes(jpeg_bytes(7))
    _settle(root)
    return root


@pytest.mark.parametrize("cls", ["ImageFolderSource", "FileTreeSource"])
def test_a_settled_tree_is_read_back_in_a_new_process_without_a_scan(tree, cls):
    first = _listed_in_a_new_process(cls, tree)
    assert _listed_in_a_new_process(cls, tree, "kept") == first == _listed(cls, tree, "kept")
    assert len(first[1]) == 6


@pytest.mark.parametrize("cls", ["ImageFolderSource", "FileTreeSource"])
@pytest.mark.parametrize("change", ["add", "remove", "rename", "replace a folder"])
def test_a_changed_tree_is_listed_again(tree, cls, change):
    first = _listed(cls, tree)
    if change == "add":
        (tree / "dog" / "sub" / "new.jpg").write_bytes(jpeg_bytes(9))
    elif change == "remove":
        (tree / "dog" / "sub" / "deep.jpg").unlink()
    elif change == "rename":
        (tree / "cat").rename(tree / "cow")
    else:  # the same names in a new folder, every mtime as before: its inode tells it apart
        (tree / "dog" / "sub").rename(tree / "old")
        (tree / "dog" / "sub").mkdir()
        (tree / "old" / "deep.jpg").rename(tree / "dog" / "sub" / "deep.jpg")
        (tree / "old").rmdir()
        _settle(tree)
    with pytest.raises(AssertionError, match="scanned"):
        _listed(cls, tree, "kept")
    _settle(tree, PAST - 10**9)
    again = _listed(cls, tree)
    assert _listed(cls, tree, "kept") == again  # the new listing is kept in turn
    fresh = (ImageFolderSource if cls == "ImageFolderSource" else FileTreeSource)(tree)
    assert again[1] == [fresh.describe(i) for i in range(len(fresh))]
    assert again[2] == fresh.nbytes == sum(os.path.getsize(path) for path in again[1])
    if change != "replace a folder":
        assert again[1] != first[1]


def test_a_tree_changed_just_before_the_scan_is_not_kept(tmp_path):
    root = tmp_path / "imgs"
    make_image_folder(root, {"dog": 2})
    before = set(listings_folder().iterdir())
    ImageFolderSource(root)
    assert set(listings_folder().iterdir()) == before
    _settle(root)
    ImageFolderSource(root)
    assert len(set(listings_folder().iterdir()) - before) == 1


@pytest.mark.parametrize("fault", ["cut short", "a byte changed", "readable by others", "a link"])
def test_a_damaged_or_foreign_kept_listing_is_never_believed(tree, fault, tmp_path):
    first = _listed("ImageFolderSource", tree)
    source = ImageFolderSource(tree)
    kept = listings_folder() / listing_name(("image-folder", str(tree), *source.extensions))
    data = kept.read_bytes()
    if fault == "cut short":
        kept.write_bytes(data[: len(data) // 2])
    elif fault == "a byte changed":
        kept.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif fault == "readable by others":
        kept.chmod(0o644)
    else:
        (tmp_path / "elsewhere").write_bytes(data)
        kept.unlink()
        kept.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(AssertionError, match="scanned"):
        _listed("ImageFolderSource", tree, "kept")
    assert _listed("ImageFolderSource", tree) == first
    assert _listed("ImageFolderSource", tree, "kept") == first  # a sound one replaced it


def test_a_file_rewritten_in_place_is_read_from_storage_not_served_stale(tree, shm_dir):
    """No folder changes when a file is rewritten in place: the kept listing is used, and the file's
    identity, checked against the one its record was admitted with, sends it to storage."""

    def epoch() -> tuple[list[bytes], loader.LoaderStats]:
        data = loader.ImageFolder(str(tree), transform=None)
        dl = loader.DataLoader(data, batch_size=None, cache_bytes=1 << 20, cache_dir=shm_dir)
        records = [bytes(raw) for raw, _ in dl]
        return records, dl.stats()

    first, _ = epoch()
    assert epoch()[1].hits == len(first)
    target = tree / "cat" / "img0.jpg"
    with open(target, "r+b") as f:  # the same size, other bytes
        f.write(jpeg_bytes(99)[: target.stat().st_size].ljust(target.stat().st_size, b"\0"))
    os.utime(target, ns=(time.time_ns(), time.time_ns()))
    _listed("ImageFolderSource", tree, "kept")  # no folder changed: the kept listing stands
    records, stats = epoch()
    expected = [target.read_bytes() if i == 0 else raw for i, raw in enumerate(first)]
    assert records == expected
    assert stats.hits == len(first) - 1 and stats.misses == 1


def test_a_root_whose_name_is_not_utf8_is_listed_and_kept(tmp_path):
    root = tmp_path / os.fsdecode(b"caf\xe9")  # not UTF-8: held as a surrogate escape
    make_image_folder(root, {"dog": 2})
    _settle(root)
    first = _listed("ImageFolderSource", root)
    assert _listed("ImageFolderSource", root, "kept") == first and len(first[1]) == 2


def test_a_folder_whose_mtime_was_set_back_is_listed_again(tree):
    """``tar x``, ``cp -a`` and ``rsync -a`` write into a folder, then set its mtime back: its ctime moves."""
    first = _listed("FileTreeSource", tree)
    (tree / "dog" / "sub" / "deep.jpg").unlink()
    (tree / "dog" / "sub" / "other.jpg").write_bytes(jpeg_bytes(3))
    _settle(tree)  # every mtime as it was when listed
    with pytest.raises(AssertionError, match="scanned"):
        _listed("FileTreeSource", tree, "kept")
    again = _listed("FileTreeSource", tree)
    assert str(tree / "dog" / "sub" / "other.jpg") in again[1] and again[1] != first[1]


def test_a_kept_listing_of_another_layout_behind_a_sound_sum_is_listed_again(tree):
    """A layout this code does not read (a writer's fault, a later version) fails nothing: listed again."""
    first = _listed("ImageFolderSource", tree)
    kept = listings_folder() / listing_name(("image-folder", str(tree), *ImageFolderSource(tree).extensions))
    header = json.dumps({"arrays": [], "folders": ["", "x"], "marks": [[1, 2, 3, 4]]}).encode()
    body = MAGIC + len(header).to_bytes(8, "little") + header
    kept.write_bytes(body + hashlib.sha256(body).digest())
    with pytest.raises(AssertionError, match="scanned"):
        _listed("ImageFolderSource", tree, "kept")
    assert _listed("ImageFolderSource", tree) == first


def test_what_a_killed_writer_left_is_removed_by_the_next(tree):
    pid = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    name = listing_name(("file-tree", str(tree)))
    left = listings_folder() / f".{name}.{int(pid.stdout)}.0badf00d"  # that process is gone
    left.write_bytes(b"half a listing")
    _listed("FileTreeSource", tree)
    assert not left.exists() and (listings_folder() / name).exists()


def test_a_fresh_listing_of_a_tree_with_a_file_rewritten_keeps_its_store_and_reads_that_file_again(
    tree, shm_dir
):
    """The fingerprint covers paths and labels: a tree listed afresh opens the store it had, in which the
    rewritten file's record, admitted under its old identity, is not served."""

    def epoch() -> tuple[list[bytes], loader.LoaderStats, str]:
        data = loader.ImageFolder(str(tree), transform=None)
        dl = loader.DataLoader(data, batch_size=None, cache_bytes=1 << 20, cache_dir=shm_dir)
        return [bytes(raw) for raw, _ in dl], dl.stats(), data.source.fingerprint

    first, _, fingerprint = epoch()
    target = tree / "cat" / "img0.jpg"
    target.write_bytes(jpeg_bytes(42) + b"longer")
    for kept in listings_folder().iterdir():
        kept.unlink()
    records, stats, again = epoch()
    assert again == fingerprint
    assert records == [target.read_bytes() if i == 0 else raw for i, raw in enumerate(first)]
    assert stats.hits == len(first) - 1 and stats.misses == 1


class _Unstatted:
    """A folder's entry whose ``stat`` fails the test: a listing reads names and types alone."""

    def __init__(self, entry: os.DirEntry) -> None:
        self._entry = entry

    def __getattr__(self, name: str):
        if name == "stat":
            raise AssertionError(f"{self._entry.path} stat'ed while listed")
        return getattr(self._entry, name)


@pytest.mark.parametrize("cls", ["ImageFolderSource", "FileTreeSource"])
def test_a_listing_stats_only_a_sample_of_its_files_and_tells_their_bytes_from_it(tree, cls, monkeypatch):
    entries = _listing.Folders.entries
    monkeypatch.setattr(
        _listing.Folders, "entries", lambda self, rel: list(map(_Unstatted, entries(self, rel)))
    )
    whole, statted = _statting(cls, tree)
    assert whole[2] == sum(map(os.path.getsize, whole[1])) and sorted(statted) == sorted(whole[1])
    monkeypatch.setattr(_listing, "SAMPLE", 3)
    for kept in listings_folder().iterdir():
        kept.unlink()
    sampled, statted = _statting(cls, tree)
    assert len(statted) == 3
    assert whole[2] <= sampled[2] <= whole[2] * 1.01  # an upper estimate: the files' sizes differ by 1 B


def _statting(cls: str, root) -> tuple[list, list[str]]:
    """``_listed(cls, root)`` and the files it stat'ed by path."""
    paths, stat = [], os.stat
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "stat", lambda path, *a, **k: paths.append(os.fspath(path)) or stat(path, *a, **k))
        listed = _listed(cls, root)
    return listed, [path for path in paths if os.path.isfile(path)]
