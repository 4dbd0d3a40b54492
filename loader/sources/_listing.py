"""A listed folder tree: each file's relative path (and label) in arrays, its fingerprint, the bytes its files
hold, and the folders the scan entered, each with its mark (device, inode, mtime, ctime) from before its
entries were read.

Those folders are what tells a later run whether the listing still holds (``loader.sources._kept_listing``):
adding, removing or renaming a file changes its folder's mtime and ctime, and a mark taken before the
entries were read can only be older than any change made after. A file rewritten in place changes no
folder: a cache keeps each file's identity (``FileRecords.identity``: one stat per record in each process)
with the record it admits, and serves it only while the file still has it.

No file is stat'ed while the tree is listed: a stat cost 2.3 us a file on this machine, 2.3 s of a million
files' 3.9 s, where torchvision's listing reads names alone. The bytes the files hold, which sizes a cache,
are estimated from ``SAMPLE`` files spread evenly through the listing (4,096 stats: ~10 ms), and summed
over every file of a smaller tree. The fingerprint is one sha256 over the arrays, not a digest per file.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import statistics
import time
from array import array
from collections.abc import Iterable
from itertools import chain
from typing import Any

from loader.sources._path_index import PathIndex

__all__ = ["SAMPLE", "Batch", "Folders", "Listing", "sampled_bytes", "scanned"]

SETTLED_NS = 2 * 10**9  # a folder changed this recently may change again within its mtime's resolution
TICK_NS = 10**8  # longer than any tick of the kernel's coarse clock (1-10 ms), which stamps the ctime
SAMPLE = 4096  # files stat'ed to tell the bytes a bigger tree holds


class Folders:
    """The folders a scan entered under ``root``: each one's path relative to it and its mark (device,
    inode, mtime, ctime), taken before its entries were read. The ctime counts: ``tar x``, ``cp -a`` and
    ``rsync -a`` set a folder's mtime back after writing into it, and setting it moves the ctime, which no
    user can set."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.names: list[str] = []
        self.marks: list[tuple[int, int, int, int]] = []
        self.started = time.time_ns()

    def entries(self, rel: str) -> list[os.DirEntry]:
        """The non-hidden entries of folder ``rel`` (links followed to it), its mark taken first."""
        path = os.path.join(self.root, rel)
        self.marks.append(_mark(os.stat(path)))
        self.names.append(rel)
        with os.scandir(path) as found:
            return [e for e in found if not e.name.startswith(".")]

    def unchanged(self) -> bool:
        """Whether every folder still is the one entered, unchanged since."""
        for rel, mark in zip(self.names, self.marks, strict=True):
            try:
                st = os.stat(os.path.join(self.root, rel))
            except OSError:
                return False
            if _mark(st) != mark:
                return False
        return True

    def settled(self) -> bool:
        """Whether every folder's mtime is ``SETTLED_NS`` older than the scan and its ctime ``TICK_NS``: a
        change made during the scan within the tick of the clock that stamped the folder last would leave
        it changed with the same mark (a tool that sets the mtime back only moves the ctime)."""
        if not self.marks:
            return False
        return (
            max(m[2] for m in self.marks) < self.started - SETTLED_NS
            and max(m[3] for m in self.marks) < self.started - TICK_NS
        )


def _mark(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


class Listing:
    """The files under ``base`` (its real path): ``paths`` (a ``PathIndex``), ``labels`` (None: none),
    ``folders`` (None: a single file), ``meta`` (what the source needs besides: its classes), ``nbytes`` (the
    bytes its files hold, ``sampled_bytes``) and ``fingerprint``, which covers the base, paths and labels:
    two trees of the same names in two places are two datasets."""

    def __init__(
        self,
        kind: str,
        base: str,
        paths: PathIndex,
        labels: array | None,
        folders: Folders | None,
        meta: dict[str, Any],
        nbytes: int,
        fingerprint: str | None = None,
    ) -> None:
        self.kind, self.base, self.paths, self.labels = kind, base, paths, labels
        self.folders, self.meta = folders, meta
        self.nbytes = nbytes
        self.fingerprint = fingerprint or self._digest()

    def __len__(self) -> int:
        return len(self.paths)

    def arrays(self) -> dict[str, array | bytes]:
        """Every array the listing holds, by name (what ``_kept_listing`` writes)."""
        blob, ends, order, hashes = self.paths.parts()
        held: dict[str, array | bytes] = dict(blob=blob, ends=ends)
        held |= dict(order=order, hashes=hashes) if self.paths.searchable else {}
        return held if self.labels is None else {**held, "labels": self.labels}

    def _digest(self) -> str:
        sha = hashlib.sha256(self.kind.encode() + b"\0" + os.fsencode(self.base) + b"\0")
        for name, part in self.arrays().items():
            if name not in ("order", "hashes"):  # the index's own: they follow from the paths
                sha.update(name.encode() + b"\0")
                sha.update(memoryview(part).nbytes.to_bytes(8, "little"))
                sha.update(part)
        return sha.hexdigest()


Batch = tuple[list[str], int]  # a folder's run of relative paths, and their one label


def scanned(
    kind: str,
    base: str,
    batches: Iterable[Batch],
    folders: Folders | None,
    meta: dict[str, Any],
    labelled: bool,
) -> Listing:
    """The listing of the files under ``base`` in ``batches`` (each a folder's run of files, in record order)
    as they are scanned: no Python object is kept per file. Labels are kept where ``labelled``; a labelled
    listing is read by index, an unlabelled one (a file tree) also looked up by path
    (``PathIndex.searchable``)."""
    labels = array("q")

    def keep(batch: Batch) -> list[str]:
        if labelled:
            labels.extend(array("q", [batch[1]]) * len(batch[0]))
        return batch[0]

    paths = PathIndex(chain.from_iterable(map(keep, batches)), searchable=not labelled)
    nbytes = sampled_bytes(paths, base)
    return Listing(kind, os.path.realpath(base), paths, labels if labelled else None, folders, meta, nbytes)


def sampled_bytes(paths: PathIndex, base: str) -> int:
    """The bytes the files at ``paths`` under ``base`` hold: every file's summed where there are at most
    ``SAMPLE``; else an estimate from ``SAMPLE`` of them spread evenly that errs high, their mean plus three
    standard errors times the count (a file gone since counts as the others; a few files far larger than
    the rest, which the sample may miss, are not in it: what needs the exact sum stats every file)."""
    count = len(paths)
    taken = range(count) if count <= SAMPLE else [k * count // SAMPLE for k in range(SAMPLE)]
    sizes = []
    for i in taken:
        with contextlib.suppress(OSError):
            sizes.append(os.stat(os.path.join(base, paths[i])).st_size)
    if len(sizes) < 2 or count <= SAMPLE:
        return math.ceil(sum(sizes) * count / len(sizes)) if sizes else 0
    return math.ceil((statistics.fmean(sizes) + 3 * statistics.stdev(sizes) / math.sqrt(len(sizes))) * count)
