"""Every file under a folder as one record each: what a user's own Dataset opens by path.

A training script that opens its files itself (``PIL.Image.open(path)``, ``np.load(path)``) names records by
path, not by index; this source lists them so the cache can hold them (see ``loader.serving.files``). Symbolic
links are not listed and linked folders not entered: a link may lead out of the tree, and one that stays
inside would list a file twice. A path through a link inside the tree is still found by its real path
(``find``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator

from loader.errors import SourceError
from loader.sources._file_records import FileRecords
from loader.sources._kept_listing import kept_listing
from loader.sources._listing import Batch, Folders, Listing, scanned

__all__ = ["FileTreeSource", "shared_listing"]

KIND = "file-tree"


class FileTreeSource(FileRecords):
    """Every regular, non-hidden file under ``root`` (recursively), sorted by path relative to ``root``.

    ``read(i)`` is the file's bytes, ``describe(i)`` its path, ``label(i)`` 0. A ``root`` that is a file
    gives that one record. The fingerprint covers each file's relative path as listed, so a tree with files
    added, removed or renamed opens a new store; a file rewritten in place is told by its ``identity``,
    which a cache keeps with the record it admits.
    """

    thread_safe_reads = True  # each read opens, reads and closes its own file

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if os.path.isfile(self.root):
            self._base, name = os.path.split(self.root)
            self._listing = scanned(KIND, self._base, [([name], 0)], None, {}, False)
        elif os.path.isdir(self.root):
            self._base = self.root
            self._listing = kept_listing((KIND, self.root), self.root, self._scan)
        else:
            raise SourceError(f"file tree root {self.root!r} does not exist or is not a folder or file")
        self._real_base = os.path.realpath(self._base)
        self._paths = self._listing.paths
        self.nbytes = self._listing.nbytes
        if not self._paths:
            raise SourceError(f"file tree root {self.root!r} has no regular, non-hidden files")

    def _scan(self) -> Listing:
        folders = Folders(self.root)
        return scanned(KIND, self.root, _scan(folders, ""), folders, {}, labelled=False)

    def __len__(self) -> int:
        return len(self._paths)

    def label(self, index: int) -> int:
        self.check_index(index)
        return 0

    def describe(self, index: int) -> str:
        return os.path.join(self._base, self._paths[self.check_index(index)])

    def find(self, path: str) -> int | None:
        """The index of the listed file at ``path`` (absolute, normalised), written under the root as given
        or under its real path, else None. A caller resolves a path through links itself (``realpath``).

        The listing's paths are held compactly and read without taking a reference (``PathIndex``): a
        forked worker that looks up every file of an epoch copies none of its parent's listing.
        """
        found = self._lookup(self._base, path)
        if found is None and self._real_base != self._base:
            found = self._lookup(self._real_base, path)
        return found

    def _lookup(self, base: str, path: str) -> int | None:
        if not path.startswith(base) or path[len(base) : len(base) + 1] != os.sep:
            return None
        return self._paths.find(path[len(base) + 1 :])


_listed: weakref.WeakValueDictionary[str, FileTreeSource] = weakref.WeakValueDictionary()


def shared_listing(root: str | os.PathLike) -> FileTreeSource:
    """The ``FileTreeSource`` of ``root`` that this process holds already (listed once, while something
    holds it), else a new one.

    A job's train and evaluation loaders often serve the same folder: listing bench_tight_budget's 12,520
    files grows the process by ~2 MiB (the listing itself holds 0.8 MiB), and listing it again grew it by
    1.2 MiB more. Not listing again is safe for ``CachedFiles``: a file is served only while it has the
    identity it was admitted with, so a file changed since is read from storage; a file added since is not
    served."""
    path = os.path.abspath(os.fspath(root))
    kept = _listed.get(path)
    if kept is None:
        _listed[path] = kept = FileTreeSource(path)
    return kept


def _scan(folders: Folders, rel_dir: str) -> Iterator[Batch]:
    """The regular files under ``rel_dir`` as batches (relative paths, label 0), sorted by
    relative path; links are not followed. Only the entries of the folders on the way down are held, never
    the whole tree's: each folder's are sorted by name, a subfolder's name followed by the separator, which
    is where its files' paths sort among its siblings; a folder's run of files between two subfolders is
    one batch. A folder of files alone (most of a dataset's) is sorted by name, no key per entry."""
    prefix = rel_dir + os.sep if rel_dir else ""
    entries = folders.entries(rel_dir)
    if not any(entry.is_dir(follow_symlinks=False) for entry in entries):
        yield from _batch(prefix, sorted(e.name for e in entries if e.is_file(follow_symlinks=False)))
        return
    names: list[str] = []
    for entry in sorted(entries, key=_sort_key):
        if entry.is_dir(follow_symlinks=False):
            yield from _batch(prefix, names)
            names = []
            yield from _scan(folders, prefix + entry.name)
        elif entry.is_file(follow_symlinks=False):
            names.append(entry.name)
    yield from _batch(prefix, names)


def _batch(prefix: str, names: list[str]) -> Iterator[Batch]:
    if names:
        yield [prefix + name for name in names], 0


def _sort_key(entry: os.DirEntry) -> str:
    return entry.name + os.sep if entry.is_dir(follow_symlinks=False) else entry.name
