"""Data in object storage, copied: to a local folder (to read it without the network, or to convert it), and
another loader's converted copy put back beside it in the bucket.

An image folder at ``s3://bucket/prefix`` converted for a loader that reads its own format (LitData, MosaicML
Streaming, WebDataset: ``stallbench.jobs.others``) goes to ``s3://bucket/prefix.<kind>/``, in the data's own
bucket, where that loader reads it over the same network as the data. The objects are copied to a private
local folder, converted there by the loader's own tool, uploaded, and the stamp (``stallbench-source.json``:
the listing's fingerprint, every key, size and ETag) put last, so a copy cut short is never taken for whole. A
copy whose stamp matches the data is reused; a stale one of ours (the data changed), or one cut short (its
stamp says it was being written), is replaced; objects there without our stamp are an error naming the
location, never overwritten. Data at a bucket's root gets no copy: ``bucket.<kind>`` would be another bucket,
which anyone may own. A copy in the bucket is trusted by its stamp, as the data is trusted by its place:
whoever may write beside the data may change the data too.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stallbench.jobs.leftovers import JOB_TMP_PREFIX

__all__ = [
    "STAMP",
    "converted_object_copy",
    "download",
    "local_path",
    "object_copy",
    "presigned_urls",
    "stamped",
]

STAMP = "stallbench-source.json"
_REQUESTS = 16  # GETs or PUTs in flight while a copy is made (untimed)
_URL_SECONDS = 24 * 3600  # a presigned URL's life: a day (curl's argv shows it to local users)


def local_path(folder: Path, key: str) -> Path:
    """Where the object ``key`` (under the prefix) goes in the copy; ValueError for a key no local image
    folder could hold as the same record (an empty, ``.`` or ``..`` part, or one a local folder hides)."""
    parts = key.split("/")
    if any(part in ("", ".", "..") or part.startswith(".") for part in parts):
        raise ValueError(f"the object key {key!r} has no place in a local copy of the image folder")
    return folder.joinpath(*parts)


def download(source: Any, folder: Path) -> None:
    """Every object of the image folder ``source`` (``loader``'s S3 source) written to ``folder``, in its
    layout (``<class>/<key>``), each file created new and private."""
    under = f"s3://{source.bucket}/{source.prefix}"

    def copy(index: int) -> None:
        target = local_path(folder, source.describe(index)[len(under) :])
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(source.read(index))

    with ThreadPoolExecutor(_REQUESTS) as pool:
        list(pool.map(copy, range(len(source))))


def object_copy(url: str, kind: str) -> str:
    """Where the ``kind`` copy of the image folder at ``url`` goes: ``s3://bucket/prefix.<kind>``, in the
    data's own bucket; ValueError for data at a bucket's root, which has no prefix to sit beside
    (``bucket.<kind>`` would be another bucket, which anyone may own)."""
    from loader.sources import split_url

    if not split_url(url)[1]:
        raise ValueError(f"{url}: data at a bucket's root has no place beside it for a copy (give a prefix)")
    return f"{url.rstrip('/')}.{kind}"


def _client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client("s3", config=Config(max_pool_connections=_REQUESTS))


def _stamp(s3: Any, bucket: str, prefix: str) -> dict[str, Any] | None:
    """Our stamp under ``prefix`` (``{"data": ...}``, with ``"fingerprint"`` once the copy is whole); None
    where there is none, or where what is there is not one of ours. The store's other errors propagate."""
    from botocore.exceptions import ClientError

    try:
        body = s3.get_object(Bucket=bucket, Key=prefix + STAMP)["Body"].read()
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise
    try:
        stamp = json.loads(body)
    except ValueError:
        return None
    return stamp if isinstance(stamp, dict) and "data" in stamp else None


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def _location(source: Any, kind: str) -> tuple[str, str, str]:
    """The ``kind`` copy of ``source``'s data: its URL, bucket and prefix (``object_copy``)."""
    from loader.sources import split_url

    copy = object_copy(source.url, kind)
    return copy, *split_url(copy)


def _whole(stamp: dict[str, Any] | None, source: Any) -> bool:
    """Whether ``stamp`` is that of a whole copy of ``source``'s data as it is now."""
    return stamp is not None and stamp.get("fingerprint") == source.fingerprint


def stamped(source: Any, kind: str) -> str | None:
    """The ``kind`` copy of ``source``'s data whose stamp matches it, else None."""
    copy, bucket, prefix = _location(source, kind)
    return copy if _whole(_stamp(_client(), bucket, prefix), source) else None


def converted_object_copy(
    source: Any, kind: str, write: Callable[[str, Path], None], made: Path | None = None
) -> str:
    """The ``kind`` copy of the image folder ``source`` reads, reused where its stamp matches, else uploaded:
    ``made`` (a copy in ``kind``'s format already made from the same objects: the analysis's copy in memory,
    converted for its prep run) or, without it, one ``write`` makes (an image folder, an empty folder) from
    the objects downloaded here. ValueError naming the location where objects not ours are there. A copy of
    ours that is stale or was cut short (its stamp says it was being written) is replaced: the stamp that
    says so goes first, so no run trusts what is there meanwhile, and the whole one last. The tool's and
    the store's errors propagate (OSError, botocore's and boto3's)."""
    copy, bucket, prefix = _location(source, kind)
    s3 = _client()
    found = _stamp(s3, bucket, prefix)
    if _whole(found, source):
        return copy
    old = _keys(s3, bucket, prefix)
    if found is None and old:
        raise ValueError("something else is there, not written by stallbench")
    with tempfile.TemporaryDirectory(prefix=f"{JOB_TMP_PREFIX}-{os.getpid()}-convert-") as work:
        if made is None:
            made = Path(work) / "copy"
            download(source, Path(work) / "data")
            made.mkdir()
            write(str(Path(work) / "data"), made)
        _put_stamp(s3, bucket, prefix, {"data": source.url, "writing": True})  # the upload's first write
        for key in old:
            if key != prefix + STAMP:
                s3.delete_object(Bucket=bucket, Key=key)
        _upload(s3, bucket, prefix, made)
    _put_stamp(s3, bucket, prefix, {"data": source.url, "fingerprint": source.fingerprint})
    return copy


def _upload(s3: Any, bucket: str, prefix: str, folder: Path) -> None:
    """Every file under ``folder`` to ``prefix``, but a local copy's own stamp (the bucket's is put apart)."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != STAMP]
    with ThreadPoolExecutor(_REQUESTS) as pool:
        put = lambda p: s3.upload_file(str(p), bucket, prefix + p.relative_to(folder).as_posix())  # noqa: E731
        list(pool.map(put, files))


def _put_stamp(s3: Any, bucket: str, prefix: str, stamp: dict[str, Any]) -> None:
    s3.put_object(Bucket=bucket, Key=prefix + STAMP, Body=json.dumps(stamp).encode())


def presigned_urls(copy: str, suffix: str) -> list[str]:
    """A URL that reads each object under ``copy`` whose name ends with ``suffix`` (sorted), signed by this
    process's credentials: what a loader that reads HTTP (WebDataset, through curl) is given."""
    from loader.sources import split_url

    bucket, prefix = split_url(copy)
    s3 = _client()
    keys = sorted(k for k in _keys(s3, bucket, prefix) if k.endswith(suffix))
    sign = {"Bucket": bucket}
    return [
        s3.generate_presigned_url("get_object", Params={**sign, "Key": k}, ExpiresIn=_URL_SECONDS)
        for k in keys
    ]
