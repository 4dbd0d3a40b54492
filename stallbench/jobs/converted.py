"""An image folder converted, once, into the format another loader reads: the folder beside the data.

LitData and WebDataset (``stallbench.jobs.others``) read their own formats, written by their own tools, so
``compare --loaders litdata,webdataset`` converts the data first, untimed, as their users do. The copy goes
beside the data, ``<data>.<kind>``: on the same device, so the storage condition (the page cache evicted,
the kernel's read throttle on that device) holds for it as for the data. A copy made from the same records
is reused: ``stallbench-source.json`` in it holds the image folder's fingerprint (every image's relative
path, size and mtime). A copy is written under a temporary name and renamed when whole, so a killed
conversion leaves nothing that passes for one; a folder at that name that we did not write is an error
naming it, never removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["ConversionError", "converted_copy", "existing_copy"]

STAMP = "stallbench-source.json"
Write = Callable[[object, Path], None]  # (the image folder's Source, an empty folder) -> the copy written


class ConversionError(ValueError):
    """The data cannot be converted for a loader, or its copy cannot be read: the message names both."""


def _image_folder(data: str | os.PathLike) -> object:
    import loader

    if str(data).startswith("s3://"):
        raise ConversionError(
            f"{data}: other loaders are compared on a local image folder, not in object storage"
        )
    path = Path(data)
    if not path.is_dir() or (path / "data.mdb").exists() or (path / "state.json").exists():
        raise ConversionError(f"{path}: other loaders are compared on an image folder (class/image.jpg)")
    try:
        return loader.ImageFolderSource(path)
    except (loader.SourceError, OSError) as err:
        raise ConversionError(f"{path}: {err}") from err


def _copy_path(data: str | os.PathLike, kind: str) -> Path:
    path = Path(data).resolve()
    return path.with_name(f"{path.name}.{kind}")


def _stamp(copy: Path) -> str | None:
    with contextlib.suppress(OSError, ValueError, TypeError):
        return json.loads((copy / STAMP).read_text())["fingerprint"]
    return None


def converted_copy(data: str | os.PathLike, kind: str, write: Write) -> Path:
    """The copy of the image folder ``data`` for ``kind``: reused where its stamp matches the data, else
    written again by ``write``; ConversionError for data that is not an image folder, or a folder at the
    copy's name that holds no stamp of ours."""
    source = _image_folder(data)
    copy = _copy_path(data, kind)
    found = _stamp(copy) if copy.is_dir() else None
    if found == source.fingerprint:
        return copy
    if copy.exists() and (copy.is_symlink() or found is None):
        raise ConversionError(f"{copy}: the {kind} copy of {data} goes here, and something else is there")
    staging = Path(tempfile.mkdtemp(prefix=f".{copy.name}-", dir=copy.parent))
    try:
        write(source, staging)
        (staging / STAMP).write_text(json.dumps({"fingerprint": source.fingerprint, "data": str(data)}))
        if found is not None:
            shutil.rmtree(copy)  # a stale copy of ours: the data changed since
        staging.rename(copy)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return copy


def existing_copy(data: str | os.PathLike, kind: str) -> Path:
    """The ``kind`` copy of ``data`` a parent made before the job started; ConversionError where there is
    none (the data was not converted, or changed since)."""
    copy = _copy_path(data, kind)
    if _stamp(copy) != _image_folder(data).fingerprint:
        raise ConversionError(f"{copy}: no {kind} copy of {data} that matches it (convert it first)")
    return copy
