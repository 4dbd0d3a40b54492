"""What an analysis is asked, before the dataset is known: the data (a path or a generated workload's name),
the loaders' settings, the cache as a size or a share of the dataset, and the cold run's limits."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from stallbench.conditions.limits import NONE, Limits
from stallbench.conditions.storage import in_object_storage

__all__ = ["HALF", "AnalysisRequest", "CacheSpec", "NamedWorkload", "ObjectData", "local_files", "parse_data"]

_NAMED = re.compile(r"^(images|tokens)(?::(.*))?$")


class CacheSpec(float):
    """A cache size given as a fraction of the dataset (``"50%"``); resolved once the dataset is known."""

    def of(self, dataset_bytes: int) -> int:
        return round(self * dataset_bytes)


def cache_bytes(cache: CacheSpec | int | None, dataset_bytes: int) -> int | None:
    """``--cache`` in bytes, for a generated workload and a command alike: a fraction of the dataset's device
    bytes, or the size given."""
    return cache.of(dataset_bytes) if isinstance(cache, CacheSpec) else cache


@dataclass(frozen=True)
class NamedWorkload:
    """A generated workload asked for by name: ``images``, ``images:48``, ``tokens:2000``."""

    kind: str  # "images" or "tokens"
    count: int | None  # None: the default count

    def __str__(self) -> str:
        return self.kind if self.count is None else f"{self.kind}:{self.count}"


@dataclass(frozen=True)
class ObjectData:
    """An image folder in object storage, ``s3://bucket/prefix``: read over the network, no local file."""

    url: str

    def __str__(self) -> str:
        return self.url


Data = Path | NamedWorkload | ObjectData


def parse_data(text: str) -> Data:
    """``--data``, parsed once: a :class:`NamedWorkload` for ``"images:48"``, ``"tokens"``...; an
    :class:`ObjectData` for ``s3://bucket/prefix``; else the path.

    A count that is not a positive integer (``"images:0"``, ``"tokens:-5"``, ``"images:many"``) or an
    object storage location without a bucket raises ``ValueError`` naming it."""
    if in_object_storage(text):
        from loader.sources import split_url

        split_url(text)  # ValueError where it names no bucket
        return ObjectData(text)
    match = _NAMED.match(text)
    if match is None:
        return Path(text)
    kind, count = match[1], match[2]
    if count is None:
        return NamedWorkload(kind, None)
    if not (count.isascii() and count.isdigit() and int(count) > 0):
        raise ValueError(f"the count in {text!r} must be a positive integer ({kind}:<count>), got {count!r}")
    return NamedWorkload(kind, int(count))


HALF = CacheSpec(0.5)


def local_files(data: str | Path | ObjectData) -> list[str]:
    """The local files of ``data`` the page cache may hold (warmed, evicted, throttled): the path itself, or
    none for data in object storage, which comes over the network."""
    return [] if in_object_storage(data) else [str(data)]


@dataclass(frozen=True)
class AnalysisRequest:
    """What the command line asked for, before the dataset is known."""

    data: Data
    data_dir: Path = Path("stallbench-data")
    workers: int = 2
    batch_size: int = 64
    compute: str = "emulated:0"
    cache: int | CacheSpec = HALF
    limits: Limits = NONE  # the cold run's, as the options asked them
    epochs: int = 3
    transform: str = "train"
    seed: int = 0
    packing: str | None = None  # token data: each loader also runs with its batches packed so
    max_len: int | None = None  # tokens per pack at most; None: the longest sequence

    def __post_init__(self) -> None:
        if isinstance(self.data, str):  # a caller of the API; the command line hands it parsed
            object.__setattr__(self, "data", parse_data(self.data))
