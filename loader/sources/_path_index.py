"""The relative paths of a listed file tree, held as a few arrays rather than a Python string per path.

A sorted list of ``str`` holds ~75 bytes per path, and a binary search over it from a forked worker takes a
reference to each string it compares, a write that copies the parent's page into the worker: measured, a
forked process's lookups of bench_tight_budget's 11,520 training files copied 1.2 MiB of its parent with
``bisect``, 0.4 MiB with this index (0.2 MiB of that the lookups' own strings). Here the encoded paths sit
end to end in one ``bytes``, found by their 64-bit xxh3 hashes, sorted in an ``array`` (an array's items
become new ``int`` objects as they are read) and cut into buckets by their top bits: a lookup reads where
its bucket starts and the few hashes in it, where a binary search over the whole array touched ~14 places
of it. A Dataset's lookups run between decodes that leave the processor's caches cold, where each place
touched is a miss: over the 11,520 files, a lookup between two decodes took 4.2 us with the binary search,
~2.3 with the buckets (a dict of the paths, 2.0). ~20 bytes per path beside its name, read and never
written by a lookup. A hash shared by two paths is told apart by comparing the paths themselves. The index
is built as the paths are read, one at a time, and sorted by numpy: no Python object per path, even while
it is built.
Written by hand: neither the standard library nor numpy holds a set of strings outside Python objects."""

from __future__ import annotations

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


def _buckets(hashes: array) -> tuple[int, array]:
    """(shift, starts): the sorted ``hashes`` whose top bits (``h >> shift``) are ``b`` lie in
    ``[starts[b], starts[b + 1])``; one to two hashes a bucket, 2-4 bytes a hash."""
    bits = max(1, (len(hashes) // 2).bit_length())
    edges = np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
    starts = np.append(np.searchsorted(np.frombuffer(hashes, np.uint64), edges), len(hashes))
    wide = len(hashes) >= 1 << 32
    return 64 - bits, array("Q" if wide else "I", starts.astype(np.uint64 if wide else np.uint32).tobytes())


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
        self._shift, self._starts = _buckets(self._hashes)

    @property
    def searchable(self) -> bool:
        return len(self._hashes) == len(self._ends)

    @classmethod
    def from_parts(cls, blob: bytes, ends: array, order: array, hashes: array) -> PathIndex:
        """The index whose ``parts()`` these are (a kept listing read back)."""
        index = cls.__new__(cls)
        index._blob, index._ends, index._order, index._hashes = blob, ends, order, hashes
        index._shift, index._starts = _buckets(hashes)
        return index

    def parts(self) -> tuple[bytes, array, array, array]:
        """The encoded paths end to end, where each ends, and the sorted hashes with their positions (the
        buckets follow from the hashes)."""
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
            encoded = path.encode(_FS, _ERRORS)
        except (UnicodeEncodeError, ValueError):  # a str no file name can be
            return None
        h = _hash(encoded)
        hashes, bucket = self._hashes, h >> self._shift
        at, end = self._starts[bucket], self._starts[bucket + 1]
        while at < end:
            if hashes[at] == h and self._encoded(i := self._order[at]) == encoded:
                return i
            at += 1
        return None

    def _encoded(self, i: int) -> bytes:
        return self._blob[self._ends[i - 1] if i else 0 : self._ends[i]]
