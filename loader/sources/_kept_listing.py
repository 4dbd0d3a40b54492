"""A folder's listing kept for the next run, with its fingerprint, so a tree that has not changed is not
listed again.

Listing a million small files took 1.1-1.3 s here, names alone (``_listing``: no file is stat'ed), and a
job lists the same tree on every run. So a listing is kept in this user's private folder of the cache home
(``$STALLBENCH_CACHE_DIR``, else ``/var/tmp``), named by its source's kind, root and options, and read back
while every folder it entered has the device, inode, mtime and ctime it had (``Folders.unchanged``): a
thousand stats, 0.07-0.1 s. A listing whose folders changed within
``SETTLED_NS`` of its scan is not kept: the folder clock's tick could hide a change made during the scan.

The file is ours alone (made ``O_EXCL``, 0600, in a 0700 folder, opened without following links, moved into
place whole: ``replace_private``) and ends with a sha256 of all it holds: a file cut short, damaged or of
another layout is listed again and replaced, never believed, and never fails the job. Where the folder cannot
be used (no such home, not ours, full), the tree is listed as before. Kept listings are not removed (a
million files' takes 38-46 MB); ``$STALLBENCH_CACHE_DIR/stallbench-<uid>/listings`` may be emptied at any
time. Written by hand: the arrays go to disk as they are held, and no library reads them back with a
checksum and an owner check.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from array import array
from collections.abc import Callable
from pathlib import Path

from loader.sources._listing import Folders, Listing
from loader.sources._path_index import PathIndex
from loader.system.home import CACHE_DIR_VARIABLE, default_cache_dir
from loader.system.private import open_private, private_dir, replace_private, user_dir

__all__ = ["kept_listing", "listing_name", "listings_folder"]

MAGIC = b"stallbench-listing 2\n"  # 1: sizes and mtimes, BLAKE2 path hashes
_SUM = 32  # bytes of the sha256 the file ends with
_TYPECODES = dict(blob=None, ends="q", order="q", hashes="Q", labels="q")


def kept_listing(key: tuple[str, ...], root: str, scan: Callable[[], Listing]) -> Listing:
    """The listing kept under ``key`` where its folders under ``root`` are unchanged, else ``scan()``'s,
    kept for the next run where its folders had settled."""
    folder, name = listings_folder(), listing_name(key)
    kept = _read(folder, name, root) if folder is not None else None
    if kept is not None:
        return kept
    listing = scan()
    if folder is not None and listing.folders is not None and listing.folders.settled():
        with contextlib.suppress(OSError):
            replace_private(folder, name, _encoded(listing))
    return listing


def listing_name(key: tuple[str, ...]) -> str:
    """The name a listing of ``key`` (its source's kind, root and options) is kept under."""
    return "listing-" + hashlib.sha256(b"\0".join(map(os.fsencode, key))).hexdigest()[:40]


def listings_folder() -> Path | None:
    """This user's folder of kept listings in the cache home, or None where it cannot be had."""
    try:
        return private_dir(user_dir(default_cache_dir(), f"${CACHE_DIR_VARIABLE}"), "listings")
    except OSError:
        return None


def _encoded(listing: Listing) -> list[bytes | memoryview]:
    """The listing as the file holds it: magic, header length, header (JSON), arrays, their sha256."""
    folders = listing.folders
    assert folders is not None
    parts = listing.arrays()
    header = {
        "kind": listing.kind,
        "base": listing.base,
        "meta": listing.meta,
        "fingerprint": listing.fingerprint,
        "nbytes": listing.nbytes,
        "folders": folders.names,
        "marks": folders.marks,
        "arrays": [[key, memoryview(part).nbytes] for key, part in parts.items()],
    }
    encoded = json.dumps(header).encode()
    arrays = (memoryview(part).cast("B") for part in parts.values())
    body = [MAGIC, len(encoded).to_bytes(8, "little"), encoded, *arrays]
    sha = hashlib.sha256()
    for part in body:
        sha.update(part)
    return [*body, sha.digest()]


def _read(folder: Path, name: str, root: str) -> Listing | None:
    """The listing in ``folder/name`` where its folders under ``root`` are unchanged; None where there is
    none, it is not ours, it fails its check or it cannot be read (a listing kept is never worth a job)."""
    try:
        fd = open_private(folder, name, os.O_RDONLY)
    except OSError:
        return None
    try:
        with io.FileIO(fd) as f:
            data = f.readall()
        view = memoryview(data)
        if not data.startswith(MAGIC) or hashlib.sha256(view[:-_SUM]).digest() != data[-_SUM:]:
            return None
        listing = _parse(view[len(MAGIC) : -_SUM], root)
        return listing if listing.folders is not None and listing.folders.unchanged() else None
    except Exception:  # an I/O error, or a file of another layout behind a sound sum
        return None


def _parse(view: memoryview, root: str) -> Listing:
    size = int.from_bytes(view[:8], "little")
    header = json.loads(bytes(view[8 : 8 + size]))
    at, parts = 8 + size, {}
    for key, nbytes in header["arrays"]:
        chunk = view[at : at + nbytes]
        at += nbytes
        parts[key] = bytes(chunk) if _TYPECODES[key] is None else _array(_TYPECODES[key], chunk)
    folders = Folders(root)
    folders.names = [str(name) for name in header["folders"]]
    folders.marks = [tuple(int(n) for n in mark) for mark in header["marks"]]
    if len(folders.names) != len(folders.marks) or any(len(mark) != 4 for mark in folders.marks):
        raise ValueError("folders and their marks do not match")
    order, hashes = parts.get("order", array("q")), parts.get("hashes", array("Q"))
    paths = PathIndex.from_parts(parts["blob"], parts["ends"], order, hashes)
    count = len(paths)
    labels = parts.get("labels")
    if len(order) != len(hashes) or (labels is not None and len(labels) != count):
        raise ValueError("arrays of different lengths")
    if count and parts["ends"][-1] != len(parts["blob"]):
        raise ValueError("arrays of different lengths")
    kind, base, meta = header["kind"], header["base"], header["meta"]
    return Listing(kind, base, paths, labels, folders, meta, int(header["nbytes"]), header["fingerprint"])


def _array(typecode: str, chunk: memoryview) -> array:
    held = array(typecode)
    held.frombytes(chunk)
    return held
