"""WebDataset tar shards read by random access: one record per sample, through an index of member offsets.

A shard is an uncompressed tar file whose members are grouped by key, as WebDataset writes them: a member's
key is its path up to the first dot of its file name, its extension the rest (``n01440764/img_0001.jpg``:
key ``n01440764/img_0001``, extension ``jpg``). A sample is the members of one key; its record is the bytes
of its image member (the first whose extension is an image's), its label the integer in its ``cls`` member
(``cls``, ``cls.txt``, ``label`` or ``label.txt``), None where it has none. Samples without an image are
left out.

Python's ``tarfile`` lists the members and where each one's data starts; this module keeps those offsets
(numpy arrays: the index crosses into each worker in its pickle, so no worker lists the shards again) and
reads a record with one ``pread``, so a shuffled order and the cache work per record, as for files. The
labels are read when the source is opened (a few bytes per sample, in the order of the shards).
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Sequence

import numpy as np

from loader.errors import BadRecordError, SourceError
from loader.sources._fingerprint import digest
from loader.sources.base import Source
from loader.sources.image_folder import IMG_EXTENSIONS

__all__ = ["LABEL_EXTENSIONS", "TarShardsSource"]

LABEL_EXTENSIONS = ("cls", "cls.txt", "label", "label.txt")


class TarShardsSource(Source):
    """The samples of ``shards``: a folder (every ``*.tar`` in it, sorted by name), one ``.tar`` file, or a
    list of them, in order. ``read`` returns a sample's image bytes."""

    thread_safe_reads = True  # one pread per record, on a descriptor per shard
    _per_process = ("_fds",)

    def __init__(self, shards: str | os.PathLike | Sequence[str | os.PathLike]) -> None:
        self.shards = _shard_paths(shards)
        members = [_samples(path) for path in self.shards]
        self._shard = np.concatenate([np.full(len(m), i, np.int32) for i, m in enumerate(members)])
        rows = [row for m in members for row in m]
        if not rows:
            raise SourceError(f"the tar shards {self.shards[0]!r}... hold no sample with an image member")
        self._keys = [row[0] for row in rows]
        self._offset = np.array([row[1] for row in rows], np.int64)
        self._size = np.array([row[2] for row in rows], np.int64)
        self._labels = [row[3] for row in rows]
        self.nbytes = int(self._size.sum())
        stats = [os.stat(p) for p in self.shards]
        names = [os.path.basename(p) for p in self.shards]
        self._fingerprint = digest(
            (n, st.st_size, st.st_mtime_ns) for n, st in zip(names, stats, strict=True)
        )
        self._fds: dict[int, int] = {}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._fds = {}

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)

    def __len__(self) -> int:
        return len(self._keys)

    def read(self, index: int) -> bytes:
        i = self.check_index(index)
        size, offset = int(self._size[i]), int(self._offset[i])
        try:
            raw = os.pread(self._fd(int(self._shard[i])), size, offset)
        except OSError as e:
            raise BadRecordError(self.describe(i), i, f"cannot read the shard: {e.strerror or e}") from e
        if len(raw) != size:
            raise BadRecordError(self.describe(i), i, f"the shard ends {size - len(raw)} bytes early")
        return raw

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds.setdefault(shard, os.open(self.shards[shard], os.O_RDONLY | os.O_CLOEXEC))
        return fd

    def label(self, index: int) -> int | None:
        return self._labels[self.check_index(index)]

    def describe(self, index: int) -> str:
        i = self.check_index(index)
        return f"{self.shards[int(self._shard[i])]}[{self._keys[i]}]"

    @property
    def fingerprint(self) -> str:
        """Digest of every shard's name, size and mtime as listed when the source was opened."""
        return self._fingerprint


def _shard_paths(shards: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    if isinstance(shards, (str, os.PathLike)):
        path = os.fspath(shards)
        if os.path.isdir(path):
            found = sorted(e.path for e in os.scandir(path) if e.name.endswith(".tar") and e.is_file())
            if not found:
                raise SourceError(f"the folder {path!r} holds no .tar shards")
            return found
        shards = [path]
    paths = [os.fspath(p) for p in shards]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing or not paths:
        raise SourceError(f"tar shard {missing[0] if missing else '(none given)'!r} does not exist")
    return paths


def _samples(path: str) -> list[tuple[str, int, int, int | None]]:
    """(key, data offset, size, label) per sample of the shard at ``path`` with an image member."""
    try:
        with tarfile.open(path, "r:") as tar:  # "r:": uncompressed only; a compressed shard has no offsets
            grouped: dict[str, dict[str, tarfile.TarInfo]] = {}
            for member in tar:
                if member.isfile():
                    folder, _, name = member.name.rpartition("/")
                    stem, _, ext = name.partition(".")
                    grouped.setdefault(f"{folder}/{stem}" if folder else stem, {})[ext.lower()] = member
            images = ((key, parts, _image(parts)) for key, parts in grouped.items())
            return [_sample(tar, key, parts, image) for key, parts, image in images if image is not None]
    except tarfile.ReadError as e:
        raise SourceError(
            f"tar shard {path!r} cannot be listed ({e}): shards are read by offset, from uncompressed tars"
        ) from e


def _image(parts: dict[str, tarfile.TarInfo]) -> tarfile.TarInfo | None:
    return next((m for ext, m in parts.items() if f".{ext}" in IMG_EXTENSIONS), None)


def _sample(
    tar: tarfile.TarFile, key: str, parts: dict[str, tarfile.TarInfo], image: tarfile.TarInfo
) -> tuple:
    found = next((parts[ext] for ext in LABEL_EXTENSIONS if ext in parts), None)
    label = None
    if found is not None:
        text = tar.extractfile(found).read().strip()
        try:
            label = int(text)
        except ValueError:
            raise SourceError(f"the label of {tar.name}[{key}] is not an integer: {text[:40]!r}") from None
    return key, image.offset_data, image.size, label
