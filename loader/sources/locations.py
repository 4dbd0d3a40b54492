"""Where a dataset lives: whether a location names objects in an S3-compatible store (``s3://bucket/prefix``)
rather than local files, and its bucket and prefix. The one place that tells, for the loader's sources and
for stallbench (which reads no local file, page cache or disk throttle for such data)."""

from __future__ import annotations

__all__ = ["OBJECT_SCHEME", "in_object_storage", "split_url"]

OBJECT_SCHEME = "s3://"


def in_object_storage(location: object) -> bool:
    """Whether ``location`` (a path, a URL, or what prints as one) names objects in object storage."""
    return str(location).startswith(OBJECT_SCHEME)


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (``bucket``, ``some/prefix/``); ValueError for anything else."""
    rest = url[len(OBJECT_SCHEME) :] if in_object_storage(url) else ""
    if not rest.split("/", 1)[0]:
        raise ValueError(f"an object storage location is s3://bucket/prefix, got {url!r}")
    bucket, _, prefix = rest.partition("/")
    return bucket, (prefix.rstrip("/") + "/") if prefix.strip("/") else ""
