"""A folder's listing kept for the next run, with its fingerprint, so a tree that has not changed is not
listed again.

Listing a tree stats each file: a million small files took 3.4 s here (2.3 s of it the stats), where
torchvision's listing, names alone, took 1.6 s; and a job lists the same tree on every run. So a listing is
kept in this user's private folder of the cache home (``$STALLBENCH_CACHE_DIR``, else ``/var/tmp``), named
by its source's kind, root and options, and read back while every folder it entered has the inode and mtime
it had (``Folders.unchanged``): a thousand stats, not a million. A listing whose folders changed within
``SETTLED_NS`` of its scan is not kept: the folder clock's tick could hide a change made during the scan.

The file is ours alone (made ``O_EXCL``, 0600, in a 0700 folder, opened without following links) and ends
with a sha256 of all it holds: a file cut short or damaged is listed again and replaced, never believed.
Where the folder cannot be used (no such home, not ours, full), the tree is listed as before.
Written by hand: the arrays go to disk as they are held, and no library reads them back with a checksum
and an owner check.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import uuid
from array import array
from collections.abc import Callable
from pathlib import Path

from loader.sources._listing import Folders, Listing
from loader.sources._path_index import PathIndex
from loader.system.home import CACHE_DIR_VARIABLE, default_cache_dir
from loader.system.private import open_private, private_dir, user_dir, write_new

__all__ = ["kept_listing", "listing_name", "listings_folder"]

MAGIC = b"stallbench-listing 1\n"
_SUM = 32  # bytes of the sha256 the file ends with
_TYPECODES = dict(blob=None, ends="q", order="q", hashes="Q", sizes="q", mtimes="q", labels="q")


def kept_listing(key: tuple[str, ...], root: str, scan: Callable[[], Listing]) -> Listing:
    """The listing kept under ``key`` where its folders under ``root`` are unchanged, else ``scan()``'s,
    kept for the next run where its folders had settled."""
    folder, name = listings_folder(), listing_name(key)
    if folder is not None:
        kept = _read(folder, name, root)
        if kept is not None and kept.folders is not None and kept.folders.unchanged():
            return kept
    listing = scan()
    if folder is not None and listing.folders is not None and listing.folders.settled():
        with contextlib.suppress(OSError):
            _write(folder, name, listing)
    return listing


def listing_name(key: tuple[str, ...]) -> str:
    """The name a listing of ``key`` (its source's kind, root and options) is kept under."""
    return "listing-" + hashlib.sha256("\0".join(key).encode()).hexdigest()[:40]


def listings_folder() -> Path | None:
    """This user's folder of kept listings in the cache home, or None where it cannot be had."""
    try:
        return private_dir(user_dir(default_cache_dir(), f"${CACHE_DIR_VARIABLE}"), "listings")
    except OSError:
        return None


def _write(folder: Path, name: str, listing: Listing) -> None:
    """Write under a name of our own, then move it over ``name`` at once: a reader sees a whole file."""
    folders = listing.folders
    assert folders is not None
    parts = listing.arrays()
    header = {
        "kind": listing.kind,
        "meta": listing.meta,
        "fingerprint": listing.fingerprint,
        "folders": folders.names,
        "folder_inodes": folders.inodes.tolist(),
        "folder_mtimes": folders.mtimes.tolist(),
        "arrays": [[key, memoryview(part).nbytes] for key, part in parts.items()],
    }
    encoded = json.dumps(header).encode()
    arrays = (memoryview(part).cast("B") for part in parts.values())
    body = [MAGIC, len(encoded).to_bytes(8, "little"), encoded, *arrays]
    sha = hashlib.sha256()
    for part in body:
        sha.update(part)
    temporary = folder / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        write_new(temporary, [*body, sha.digest()])
        os.replace(temporary, folder / name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _read(folder: Path, name: str, root: str) -> Listing | None:
    """The listing in ``folder/name``, or None where there is none, it is not ours, or it fails its check."""
    try:
        fd = open_private(folder, name, os.O_RDONLY)
    except OSError:
        return None
    with io.FileIO(fd) as f:
        data = f.readall()
    view = memoryview(data)
    if not data.startswith(MAGIC) or hashlib.sha256(view[:-_SUM]).digest() != data[-_SUM:]:
        return None
    try:
        return _parse(view[len(MAGIC) : -_SUM], root)
    except (ValueError, KeyError, TypeError):
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
    folders.names = header["folders"]
    folders.inodes, folders.mtimes = array("q", header["folder_inodes"]), array("q", header["folder_mtimes"])
    order, hashes = parts.get("order", array("q")), parts.get("hashes", array("Q"))
    paths = PathIndex.from_parts(parts["blob"], parts["ends"], order, hashes)
    count = len(paths)
    labels = parts.get("labels")
    if len(order) != len(hashes) or any(len(a) != count for a in (parts["sizes"], parts["mtimes"])):
        raise ValueError("arrays of different lengths")
    if (labels is not None and len(labels) != count) or (count and parts["ends"][-1] != len(parts["blob"])):
        raise ValueError("arrays of different lengths")
    kind, meta, fingerprint = header["kind"], header["meta"], header["fingerprint"]
    return Listing(kind, paths, parts["sizes"], parts["mtimes"], labels, folders, meta, fingerprint)


def _array(typecode: str, chunk: memoryview) -> array:
    held = array(typecode)
    held.frombytes(chunk)
    return held
