"""The relative paths of a listed file tree, held as a few arrays rather than a Python string per path.

A sorted list of ``str`` holds ~75 bytes per path, and a binary search over it from a forked worker takes a
reference to each string it compares, a write that copies the parent's page into the worker: measured, a
forked process's lookups of bench_tight_budget's 11,520 training files copied 1.2 MiB of its parent with
``bisect``, 0.4 MiB with this index (0.2 MiB of that the lookups' own strings). Here the encoded paths sit
end to end in one ``bytes``, found by a binary search of a sorted ``array`` of their 64-bit xxh3 hashes
(an array's items become new ``int`` objects as they are read): ~24 bytes per path beside its name, read
and never written by a lookup, which takes ~2.5 us (``bisect`` over the strings ~0.6 us; a 3.8 KB JPEG's
decode and read ~70 us). A hash shared by two paths is told apart by comparing the paths themselves. The
index is built as the paths are read, one at a time, and sorted by numpy: no Python object per path, even
while it is built.
Written by hand: neither the standard library nor numpy holds a sorted set of strings outside Python
objects."""

from __future__ import annotations

import bisect
import os
import sys
from array import array
from collections.abc import Iterable
from itertools import accumulate, islice

import numpy as np
import xxhash

__all__ = ["PathIndex"]


_CHUNK = 4096  # paths encoded, joined and hashed together
_FS, _ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # os.fsencode's, without its call


def _digest(encoded: bytes) -> bytes:
    return xxhash.xxh3_64_digest(encoded)


def _hash(encoded: bytes) -> int:
    return int.from_bytes(_digest(encoded), "little")


class PathIndex:
    """``paths[i]`` for ``i`` in ``range(len(paths))``, and, where built ``searchable``, ``find(path) -> i``
    (the hashes cost ~0.1 us a path to build, xxh3 where BLAKE2 took 0.4: a million-file image folder, read
    by index, skips them); picklable."""

    def __init__(self, paths: Iterable[str], searchable: bool = True) -> None:
        blob, ends, hashes = bytearray(), array("q"), bytearray()
        paths = iter(paths)
        while chunk := [path.encode(_FS, _ERRORS) for path in islice(paths, _CHUNK)]:
            # a chunk at a time: a listing read as it is scanned is never held as objects
            ends.extend(islice(accumulate(map(len, chunk), initial=len(blob)), 1, None))
            blob += b"".join(chunk)
            if searchable:
                hashes += b"".join([_digest(encoded) for encoded in chunk])
        self._blob, self._ends = bytes(blob), ends
        keys = np.frombuffer(hashes, "<u8")
        order = np.argsort(keys, kind="stable")
        self._order = array("q", order.astype(np.int64).tobytes())
        self._hashes = array("Q", keys[order].astype(np.uint64).tobytes())

    @property
    def searchable(self) -> bool:
        return len(self._hashes) == len(self._ends)

    @classmethod
    def from_parts(cls, blob: bytes, ends: array, order: array, hashes: array) -> PathIndex:
        """The index whose ``parts()`` these are (a kept listing read back)."""
        index = cls.__new__(cls)
        index._blob, index._ends, index._order, index._hashes = blob, ends, order, hashes
        return index

    def parts(self) -> tuple[bytes, array, array, array]:
        """The encoded paths end to end, where each ends, and the sorted hashes with their positions."""
        return self._blob, self._ends, self._order, self._hashes

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> str:
        return os.fsdecode(self._encoded(i))

    def find(self, path: str) -> int | None:
        """The position of ``path``, or None where it is not one of the paths."""
        if not self.searchable:
            raise TypeError("this path index was built without lookups (searchable=False)")
        try:
            encoded = os.fsencode(path)
        except (UnicodeEncodeError, ValueError):  # a str no file name can be
            return None
        h = _hash(encoded)
        hashes = self._hashes
        at = bisect.bisect_left(hashes, h)
        while at < len(hashes) and hashes[at] == h:
            i = self._order[at]
            if self._encoded(i) == encoded:
                return i
            at += 1
        return None

    def _encoded(self, i: int) -> bytes:
        return self._blob[self._ends[i - 1] if i else 0 : self._ends[i]]
