"""Every file under a folder as one record each: what a user's own Dataset opens by path.

A training script that opens its files itself (``PIL.Image.open(path)``, ``np.load(path)``) names records by
path, not by index; this source lists them so the cache can hold them (see ``loader.files``). Symbolic links
are not listed and linked folders not entered: a link may lead out of the tree, and one that stays inside
would list a file twice. A path through a link inside the tree is still found by its real path (``find``).
"""

from __future__ import annotations

import os
import weakref
from array import array
from collections.abc import Iterable, Iterator

from loader.errors import SourceError
from loader.sources._file_records import FileRecords
from loader.sources._fingerprint import Digest
from loader.sources._path_index import PathIndex

__all__ = ["FileTreeSource", "shared_listing"]


class FileTreeSource(FileRecords):
    """Every regular, non-hidden file under ``root`` (recursively), sorted by path relative to ``root``.

    ``read(i)`` is the file's bytes, ``describe(i)`` its path, ``label(i)`` 0. A ``root`` that is a file
    gives that one record. The fingerprint covers each file's relative path, size and mtime as listed, so a
    changed tree opens a new store; ``listed(i)`` gives that size and mtime to check a file against later.
    """

    thread_safe_reads = True  # each read opens, reads and closes its own file

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if os.path.isfile(self.root):
            self._base, name = os.path.split(self.root)
            st = os.stat(self.root)
            files: Iterable[tuple[str, int, int]] = [(name, st.st_size, st.st_mtime_ns)]
        elif os.path.isdir(self.root):
            self._base = self.root
            files = _scan(self.root, "")
        else:
            raise SourceError(f"file tree root {self.root!r} does not exist or is not a folder or file")
        self._real_base = os.path.realpath(self._base)
        self._list(files)
        if not self._paths:
            raise SourceError(f"file tree root {self.root!r} has no regular, non-hidden files")

    def _list(self, files: Iterable[tuple[str, int, int]]) -> None:
        """Keep each (path, size, mtime) as it is scanned, in arrays: a tree may hold millions of files, and
        the scan's own objects, held all at once, stayed in the allocator's arenas after they were freed
        (listing bench_tight_budget's 12,520 files left the process 3.2 MiB bigger with the listing freed)."""
        self._sizes, self._mtimes, fingerprint = array("q"), array("q"), Digest()
        fingerprint.add("file-tree")

        def keep(file: tuple[str, int, int]) -> str:
            self._sizes.append(file[1])
            self._mtimes.append(file[2])
            fingerprint.add(file)
            return file[0]

        self._paths = PathIndex(map(keep, files))
        self.nbytes = sum(self._sizes)
        self._fingerprint = fingerprint.hexdigest()

    def __len__(self) -> int:
        return len(self._paths)

    def label(self, index: int) -> int:
        self.check_index(index)
        return 0

    def describe(self, index: int) -> str:
        return os.path.join(self._base, self._paths[self.check_index(index)])

    def listed(self, index: int) -> tuple[int, int]:
        """(size, mtime_ns) of file ``index`` when the tree was listed."""
        i = self.check_index(index)
        return self._sizes[i], self._mtimes[i]

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

    @property
    def fingerprint(self) -> str:
        """Digest of every file's relative path, size and mtime as listed when the source was opened."""
        return self._fingerprint


_listed: weakref.WeakValueDictionary[str, FileTreeSource] = weakref.WeakValueDictionary()


def shared_listing(root: str | os.PathLike) -> FileTreeSource:
    """The ``FileTreeSource`` of ``root`` that this process holds already (listed once, while something
    holds it), else a new one.

    A job's train and evaluation loaders often serve the same folder: listing bench_tight_budget's 12,520
    files grows the process by ~2 MiB (the listing itself holds 0.8 MiB), and listing it again grew it by
    1.2 MiB more. Not listing again is safe for ``CachedFiles``: each read checks the file's size and mtime
    against the listing, so a file changed since is read from storage, a file added since is not served."""
    path = os.path.abspath(os.fspath(root))
    kept = _listed.get(path)
    if kept is None:
        _listed[path] = kept = FileTreeSource(path)
    return kept


def _scan(top: str, rel_dir: str) -> Iterator[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of the regular files under ``top/rel_dir``, sorted by relative path;
    links are not followed. Only the entries of the folders on the way down are held, never the whole
    tree's: each folder's are sorted by name, a subfolder's name followed by the separator, which is where
    its files' paths sort among its siblings."""
    with os.scandir(os.path.join(top, rel_dir)) as found:
        entries = sorted((e for e in found if not e.name.startswith(".")), key=_sort_key)
    for entry in entries:
        rel = os.path.join(rel_dir, entry.name)
        if entry.is_dir(follow_symlinks=False):
            yield from _scan(top, rel)
        elif entry.is_file(follow_symlinks=False):
            st = entry.stat(follow_symlinks=False)
            yield rel, st.st_size, st.st_mtime_ns


def _sort_key(entry: os.DirEntry) -> str:
    return entry.name + os.sep if entry.is_dir(follow_symlinks=False) else entry.name
