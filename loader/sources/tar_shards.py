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

Shards may be in object storage (``s3://bucket/prefix/`` for every ``.tar`` object directly under it, or
URLs of shards; ``_object_files``): the listing walks each shard's headers by ranged requests of a few kB
(about one request per sample, not a download of the shard), and a record is one ranged request.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from loader.errors import BadRecordError, SourceError
from loader.sources._fingerprint import digest
from loader.sources._object_files import file_stat, list_objects, open_object, ranged_reader
from loader.sources.base import Source
from loader.sources.image_folder_source import IMG_EXTENSIONS
from loader.sources.locations import in_object_storage

__all__ = ["LABEL_EXTENSIONS", "TarShardsSource"]

LABEL_EXTENSIONS = ("cls", "cls.txt", "label", "label.txt")


class TarShardsSource(Source):
    """The samples of ``shards``: a folder (every ``*.tar`` in it, sorted by name), one ``.tar`` file, or a
    list of them, in order. ``read`` returns a sample's image bytes."""

    thread_safe_reads = True  # one pread (or ranged request) per record, on a descriptor per shard
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
        names = [os.path.basename(p) for p in self.shards]
        self._fingerprint = digest((n, *file_stat(p)) for n, p in zip(names, self.shards, strict=True))
        self._fds: dict[int, Any] = {}  # a descriptor, or an object storage file

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._fds = {}

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            if isinstance(fd, int):
                os.close(fd)

    def __len__(self) -> int:
        return len(self._keys)

    def read(self, index: int) -> bytes:
        i = self.check_index(index)
        size, offset = int(self._size[i]), int(self._offset[i])
        try:
            fd = self._fd(int(self._shard[i]))
            raw = os.pread(fd, size, offset) if isinstance(fd, int) else fd.read_at(size, offset)
        except (OSError, SourceError) as e:
            raise BadRecordError(self.describe(i), i, f"cannot read the shard: {e.strerror or e}") from e
        if len(raw) != size:
            raise BadRecordError(self.describe(i), i, f"the shard ends {size - len(raw)} bytes early")
        return raw

    def _fd(self, shard: int) -> Any:
        fd = self._fds.get(shard)
        if fd is None:
            path = self.shards[shard]
            opened = (
                open_object(path) if in_object_storage(path) else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            )
            fd = self._fds.setdefault(shard, opened)
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
    if isinstance(shards, str) and in_object_storage(shards) and not shards.endswith(".tar"):
        found = list_objects(shards, ".tar")
        if not found:
            raise SourceError(f"{shards!r} holds no .tar shards")
        return found
    if isinstance(shards, (str, os.PathLike)):
        path = os.fspath(shards)
        if os.path.isdir(path):
            found = sorted(e.path for e in os.scandir(path) if e.name.endswith(".tar") and e.is_file())
            if not found:
                raise SourceError(f"the folder {path!r} holds no .tar shards")
            return found
        shards = [path]
    paths = [os.fspath(p) for p in shards]
    missing = [p for p in paths if not in_object_storage(p) and not os.path.isfile(p)]
    if missing or not paths:
        raise SourceError(f"tar shard {missing[0] if missing else '(none given)'!r} does not exist")
    return paths


def _samples(path: str) -> list[tuple[str, int, int, int | None]]:
    """(key, data offset, size, label) per sample of the shard at ``path`` with an image member. A label
    member is read as the walk passes it: in object storage, its bytes are in the block just fetched."""
    try:
        remote = ranged_reader(path) if in_object_storage(path) else contextlib.nullcontext()
        with remote as fileobj, tarfile.open(path, "r:", fileobj=fileobj) as tar:  # "r:": no compression
            grouped: dict[str, dict[str, tarfile.TarInfo]] = {}
            labels: dict[str, dict[str, bytes]] = {}
            for member in tar:
                if member.isfile():
                    folder, _, name = member.name.rpartition("/")
                    stem, _, ext = name.partition(".")
                    key, ext = f"{folder}/{stem}" if folder else stem, ext.lower()
                    grouped.setdefault(key, {})[ext] = member
                    if ext in LABEL_EXTENSIONS:
                        labels.setdefault(key, {})[ext] = tar.extractfile(member).read()
            images = ((key, _image(parts)) for key, parts in grouped.items())
            return [_sample(path, key, image, labels.get(key, {})) for key, image in images if image]
    except tarfile.ReadError as e:
        raise SourceError(
            f"tar shard {path!r} cannot be listed ({e}): shards are read by offset, from uncompressed tars"
        ) from e


def _image(parts: dict[str, tarfile.TarInfo]) -> tarfile.TarInfo | None:
    return next((m for ext, m in parts.items() if f".{ext}" in IMG_EXTENSIONS), None)


def _sample(path: str, key: str, image: tarfile.TarInfo, labels: dict[str, bytes]) -> tuple:
    label = next((labels[ext] for ext in LABEL_EXTENSIONS if ext in labels), None)
    if label is None:
        return key, image.offset_data, image.size, None
    try:
        return key, image.offset_data, image.size, int(label.strip())
    except ValueError:
        raise SourceError(f"the label of {path}[{key}] is not an integer: {label.strip()[:40]!r}") from None
