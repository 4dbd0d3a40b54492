"""Files in object storage (``s3://bucket/key``) for the sources that read files by offset: a Parquet file
(the Arrow source) and tar shards. They are read through pyarrow's own S3 filesystem by ranged requests, so
no local copy is made and the cache holds what was read.

Configured as boto3 is for the image folder in object storage (``loader.sources.object_store``): the
endpoint in ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, credentials and region from the environment,
and the same retry count and timeouts (a request that fails is retried with backoff; a stopped server is a
failure after ``TIMEOUT``). Each process opens its own (the sources reopen after a fork or unpickling).
pyarrow is imported only when an object is opened: ``import loader`` stays light.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from loader.errors import SourceError
from loader.sources.locations import in_object_storage, split_url
from loader.sources.object_store import ATTEMPTS, TIMEOUT

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["list_objects", "object_stat", "open_object", "file_stat", "ranged_reader"]


def _filesystem() -> Any:
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(
        endpoint_override=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=ATTEMPTS),
        connect_timeout=TIMEOUT,
        request_timeout=TIMEOUT,
    )


def _located(url: str) -> tuple[Any, str]:
    bucket, key = split_url(url)
    key = key.rstrip("/")
    if not key:
        raise SourceError(f"{url!r} names a bucket, not a file in it")
    return _filesystem(), f"{bucket}/{key}"


def object_stat(url: str) -> tuple[int, int]:
    """(size, mtime in ns) of the object at ``url``; SourceError naming it where it cannot be found."""
    import pyarrow.fs as pafs

    fs, path = _located(url)
    try:
        info = fs.get_file_info(path)
    except OSError as e:
        raise SourceError(f"{url!r} cannot be reached: {e}") from e
    if info.type != pafs.FileType.File:
        raise SourceError(f"{url!r} is not an object in the bucket")
    return info.size, info.mtime_ns


def file_stat(path: str) -> tuple[int, int]:
    """(size, mtime in ns) of the local file or the object at ``path``."""
    if in_object_storage(path):
        return object_stat(path)
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def list_objects(url: str, suffix: str) -> list[str]:
    """The objects directly under the prefix ``url`` whose names end with ``suffix``, sorted, as URLs."""
    import pyarrow.fs as pafs

    bucket, prefix = split_url(url)
    selector = pafs.FileSelector(f"{bucket}/{prefix}".rstrip("/"), allow_not_found=True)
    try:
        infos = _filesystem().get_file_info(selector)
    except OSError as e:
        raise SourceError(f"{url!r} cannot be listed: {e}") from e
    return sorted(f"s3://{i.path}" for i in infos if i.type == pafs.FileType.File and i.path.endswith(suffix))


def open_object(url: str) -> pa.NativeFile:
    """The object at ``url`` as a file read by ranged requests; SourceError naming it where it cannot be."""
    fs, path = _located(url)
    try:
        return fs.open_input_file(path)
    except FileNotFoundError:
        raise SourceError(f"{url!r} is not an object in the bucket") from None
    except OSError as e:
        raise SourceError(f"{url!r} cannot be opened: {e}") from e


class _Ranged(io.RawIOBase):
    """A seekable file over an object: each read one ranged request (``read_at``)."""

    def __init__(self, file: pa.NativeFile) -> None:
        self.file, self.pos = file, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.file.size()}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        self.file.close()
        super().close()

    def readinto(self, buffer: Any) -> int:
        data = self.file.read_at(len(buffer), self.pos)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def ranged_reader(url: str, block: int = 2048) -> io.BufferedReader:
    """The object at ``url`` as a seekable, buffered file: a walk over its tar headers costs one request of
    ``block`` bytes per member that does not lie in the last block read, not a download of the whole."""
    return io.BufferedReader(_Ranged(open_object(url)), buffer_size=block)
