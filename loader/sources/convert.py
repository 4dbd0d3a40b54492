"""Converters from an image folder to the LMDB, Arrow IPC and tar shard layouts the sources read."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile

import lmdb
import numpy as np
import pyarrow as pa

from loader.sources.arrow_source import ArrowSource
from loader.sources.image_folder_source import ImageFolderSource
from loader.sources.lmdb_source import CLASSES_KEY, LABELS_KEY, LEN_KEY, LMDBSource, pack_record, record_key
from loader.sources.tar_shards import TarShardsSource
from loader.system.pagecache import PAGE

__all__ = ["image_folder_to_arrow", "image_folder_to_lmdb", "image_folder_to_tar_shards"]

_COMMIT_BYTES = 64 << 20  # bytes per write transaction, to bound LMDB's dirty page list


def _lmdb_map_size(source: ImageFolderSource) -> int:
    """Room for every value in whole overflow pages, the tree, and headroom (only address space on Linux);
    every file's size summed (a stat each: ``nbytes`` is an estimate for a big folder, and a few large files
    it did not sample would fill the map)."""
    nbytes = sum(os.stat(source.describe(i)).st_size for i in range(len(source)))
    return 2 * (nbytes + len(source) * (PAGE + 64)) + (64 << 20)


def image_folder_to_lmdb(
    src_root: str | os.PathLike, dst_path: str | os.PathLike, *, map_size: int | None = None
) -> LMDBSource:
    """Write the image folder as an LMDB (layout in ``loader.sources.lmdb_source``); return it opened.

    The environment is written to a temporary sibling folder and renamed into place when complete, and
    ``__len__`` is the last key written, so a failed conversion never leaves something that opens.
    """
    source = ImageFolderSource(src_root)
    dst = os.fspath(dst_path)
    if os.path.exists(dst):
        raise FileExistsError(f"LMDB destination {dst!r} already exists")
    if map_size is not None and map_size <= 0:
        raise ValueError(f"map_size must be positive, got {map_size!r}")
    tmp = f"{dst}.partial-{os.getpid()}"
    try:
        env = lmdb.open(tmp, map_size=map_size or _lmdb_map_size(source), lock=False, sync=False)
        with env:
            _write_records(env, source)
            labels = np.array([source.label(i) for i in range(len(source))], dtype=">i4")
            with env.begin(write=True) as txn:
                txn.put(CLASSES_KEY, json.dumps(source.classes).encode())
                txn.put(LABELS_KEY, labels.tobytes())
                txn.put(LEN_KEY, str(len(source)).encode())
            env.sync(True)
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return LMDBSource(dst)


def _write_records(env: lmdb.Environment, source: ImageFolderSource) -> None:
    """Append every record in key order, committing every ``_COMMIT_BYTES``."""
    i, n = 0, len(source)
    while i < n:
        with env.begin(write=True) as txn:
            pending = 0
            while i < n and pending < _COMMIT_BYTES:
                value = pack_record(source.label(i), source.read(i))
                txn.put(record_key(i), value, append=True)
                pending += len(value)
                i += 1


def image_folder_to_arrow(
    src_root: str | os.PathLike, dst_path: str | os.PathLike, *, batch_rows: int = 1024
) -> ArrowSource:
    """Write the image folder as an Arrow IPC file (``image``: binary, ``label``: int32); return it opened."""
    if batch_rows <= 0:
        raise ValueError(f"batch_rows must be positive, got {batch_rows!r}")
    source = ImageFolderSource(src_root)
    dst = os.fspath(dst_path)
    schema = pa.schema([("image", pa.binary()), ("label", pa.int32())])
    schema = schema.with_metadata({"classes": json.dumps(source.classes)})
    tmp = f"{dst}.partial-{os.getpid()}"
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for start in range(0, len(source), batch_rows):
                rows = range(start, min(start + batch_rows, len(source)))
                images = pa.array([source.read(i) for i in rows], pa.binary())
                labels = pa.array([source.label(i) for i in rows], pa.int32())
                writer.write_batch(pa.record_batch([images, labels], schema=schema))
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return ArrowSource(dst, column="image", label_column="label")


def image_folder_to_tar_shards(
    src_root: str | os.PathLike, dst_dir: str | os.PathLike, *, shard_bytes: int = 256 << 20
) -> TarShardsSource:
    """Write the image folder as WebDataset tar shards in ``dst_dir`` (made here): ``shard-000000.tar``, ...,
    each closed once it holds ``shard_bytes``; sample ``i`` is ``{i:08d}.<ext>`` (the image) and
    ``{i:08d}.cls`` (its label). Each shard is written under a temporary name and renamed when complete."""
    if shard_bytes <= 0:
        raise ValueError(f"shard_bytes must be positive, got {shard_bytes!r}")
    source = ImageFolderSource(src_root)
    dst = os.fspath(dst_dir)
    os.mkdir(dst)
    i, shard = 0, 0
    while i < len(source):
        path = os.path.join(dst, f"shard-{shard:06d}.tar")
        with tarfile.open(f"{path}.partial", "w", format=tarfile.GNU_FORMAT) as tar:
            written = 0
            while i < len(source) and written < shard_bytes:
                ext = os.path.splitext(source.describe(i))[1].lower()
                raw, label = source.read(i), str(source.label(i)).encode()
                for name, data in ((f"{i:08d}{ext}", raw), (f"{i:08d}.cls", label)):
                    member = tarfile.TarInfo(name)
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))
                written, i = written + len(raw), i + 1
        os.rename(f"{path}.partial", path)
        shard += 1
    return TarShardsSource(dst)
