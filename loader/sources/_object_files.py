"""Files in object storage (``s3://bucket/key``) for the Arrow source: a Parquet file is read through
pyarrow's own S3 filesystem, by ranged requests (the footer once, then the column chunks of each row group a
read needs), so no local copy is made and the cache holds what was read.

Configured as boto3 is for the image folder in object storage (``loader.sources.object_store``): the
endpoint in ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, credentials and region from the environment,
and the same retry count and timeouts (a request that fails is retried with backoff; a stopped server is a
failure after ``TIMEOUT``). Each process opens its own (the source reopens after a fork or unpickling).
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs

from loader.errors import SourceError
from loader.sources.object_store import ATTEMPTS, TIMEOUT, split_url

__all__ = ["is_object", "object_stat", "open_object"]


def is_object(path: str) -> bool:
    """Whether ``path`` names an object in object storage (``s3://``)."""
    return path.startswith("s3://")


def _located(url: str) -> tuple[pafs.S3FileSystem, str]:
    bucket, key = split_url(url)
    key = key.rstrip("/")
    if not key:
        raise SourceError(f"{url!r} names a bucket, not a file in it")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    fs = pafs.S3FileSystem(
        endpoint_override=endpoint,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=ATTEMPTS),
        connect_timeout=TIMEOUT,
        request_timeout=TIMEOUT,
    )
    return fs, f"{bucket}/{key}"


def object_stat(url: str) -> tuple[int, int]:
    """(size, mtime in ns) of the object at ``url``; SourceError naming it where it cannot be found."""
    fs, path = _located(url)
    try:
        info = fs.get_file_info(path)
    except OSError as e:
        raise SourceError(f"{url!r} cannot be reached: {e}") from e
    if info.type != pafs.FileType.File:
        raise SourceError(f"{url!r} is not an object in the bucket")
    return info.size, info.mtime_ns


def open_object(url: str) -> pa.NativeFile:
    """The object at ``url`` as a file read by ranged requests; SourceError naming it where it cannot be."""
    fs, path = _located(url)
    try:
        return fs.open_input_file(path)
    except FileNotFoundError:
        raise SourceError(f"{url!r} is not an object in the bucket") from None
    except OSError as e:
        raise SourceError(f"{url!r} cannot be opened: {e}") from e
