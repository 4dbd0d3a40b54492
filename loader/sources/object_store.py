"""An image folder in object storage: ``s3://bucket/prefix/<class>/<image>``, one record per object.

Objects are read through boto3, the AWS SDK, configured as boto3 is (the endpoint in ``AWS_ENDPOINT_URL``,
credentials from the environment, a profile or an instance role), so any S3-compatible store works. The
bucket is listed once, when the source is opened, and the listing (key, size, ETag) crosses into each
worker in the source's pickle; the fingerprint is taken from it. Each process makes its own client (a boto3
client is safe to share between threads, not between processes), and a record is one ``GetObject``. A read
is a network round trip, so the source says its reads are thread-safe: the loader then keeps many in flight
(``readahead``). botocore retries a failed request (throttling, a dropped connection, a 5xx, no answer
within ``timeout`` seconds) with exponential backoff, ``attempts`` times in all; a read that still fails
is a bad record naming the object (``on_error``), and an error in opening names the bucket and the cause.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from loader.errors import BadRecordError, SourceError
from loader.sources._fingerprint import digest
from loader.sources.base import Source
from loader.sources.image_folder_source import IMG_EXTENSIONS
from loader.sources.locations import split_url

__all__ = ["S3ImageFolderSource"]

ATTEMPTS = 5  # botocore's "standard" retry mode: the first try and four retries, backing off
TIMEOUT = 20.0  # seconds a request may take to connect, and then to answer: a stopped server is a failure
_MAKING = threading.Lock()


class S3ImageFolderSource(Source):
    """The images under ``url`` in ImageFolder's layout: classes are the sorted names of the first level
    of "folders" under the prefix (label ids 0..K-1), records sorted by class, then key. ``read`` returns
    the object's bytes."""

    thread_safe_reads = True  # one request per read, on this process's client
    _per_process = ("_client",)

    def __init__(
        self,
        url: str,
        *,
        attempts: int = ATTEMPTS,
        timeout: float = TIMEOUT,
        extensions: tuple[str, ...] = IMG_EXTENSIONS,
    ) -> None:
        self.url, self.attempts, self.timeout = url, attempts, timeout
        self.bucket, self.prefix = split_url(url)
        self.extensions = tuple(e.lower() for e in extensions)
        self._client: Any = None
        self._pid: int | None = None
        listing = self._list()
        self.classes = sorted({key[len(self.prefix) :].split("/", 1)[0] for key, _, _ in listing})
        label = {name: i for i, name in enumerate(self.classes)}
        rows = sorted(
            (label[key[len(self.prefix) :].split("/", 1)[0]], key, size, tag) for key, size, tag in listing
        )
        if not rows:
            raise SourceError(f"{url!r} holds no images in class folders (expected prefix/<class>/<image>)")
        self._labels = [row[0] for row in rows]
        self._keys = [row[1] for row in rows]
        self.nbytes = sum(row[2] for row in rows)
        self._fingerprint = digest((key[len(self.prefix) :], size, tag) for _, key, size, tag in rows)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._client = None

    def _s3(self) -> Any:
        """This process's client, made on first use (by one read-ahead thread: making one is not
        thread-safe); a read looks only, without the lock."""
        if self._client is not None and self._pid == os.getpid():
            return self._client
        with _MAKING:
            if self._client is None or self._pid != os.getpid():
                try:  # imported where object storage is used: boto3 is not needed otherwise
                    import boto3
                    from botocore.config import Config
                except ImportError as e:
                    raise SourceError(f"{self.url!r}: object storage is read with boto3: {e}") from e

                retries = {"max_attempts": self.attempts, "mode": "standard"}
                limits = dict(connect_timeout=self.timeout, read_timeout=self.timeout)
                config = Config(retries=retries, max_pool_connections=64, **limits)
                self._client, self._pid = boto3.session.Session().client("s3", config=config), os.getpid()
        return self._client

    def _list(self) -> list[tuple[str, int, str]]:
        """(key, size, ETag) of every image under the prefix, in a class folder."""
        from botocore.exceptions import BotoCoreError, ClientError

        found = []
        try:
            pages = (
                self._s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    inside = key[len(self.prefix) :]
                    if "/" in inside and inside.lower().endswith(self.extensions):
                        found.append((key, int(obj["Size"]), obj.get("ETag", "")))
        except ClientError as e:
            raise SourceError(f"{self.url!r} cannot be listed: {_said(e)}") from e
        except BotoCoreError as e:
            raise SourceError(f"{self.url!r} cannot be listed: {e}") from e
        return found

    def __len__(self) -> int:
        return len(self._keys)

    def read(self, index: int) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        i = self.check_index(index)
        try:
            return self._s3().get_object(Bucket=self.bucket, Key=self._keys[i])["Body"].read()
        except ClientError as e:
            raise BadRecordError(self.describe(i), i, f"cannot read the object: {_said(e)}") from e
        except BotoCoreError as e:
            raise BadRecordError(self.describe(i), i, f"cannot read the object: {e}") from e

    def label(self, index: int) -> int:
        return self._labels[self.check_index(index)]

    def describe(self, index: int) -> str:
        return f"s3://{self.bucket}/{self._keys[self.check_index(index)]}"

    @property
    def fingerprint(self) -> str:
        """Digest of every image's key under the prefix, size and ETag, as listed when opened."""
        return self._fingerprint


def _said(error: Any) -> str:
    """A ClientError in words: its code and message (``NoSuchBucket: The specified bucket does not ...``)."""
    info = error.response.get("Error", {})
    return f"{info.get('Code', 'error')}: {info.get('Message', '') or error}"
