"""What a ``loader.DataLoader`` opens for a source-backed dataset: its shared cache (``cache_bytes``, "auto"
included) and its rank's part of a partitioned cache (``partition_cache``)."""

from __future__ import annotations

import os
import warnings
from typing import Any

from loader.cache import MinIOCache
from loader.cache._layout import index_bytes
from loader.datasets import SourceDataset
from loader.partition.options import partition_from
from loader.partition.wiring import PartitionedCache, check_partition_args
from loader.system.headroom import auto_cache_bytes
from loader.system.memory import format_bytes

__all__ = ["auto_capacity", "open_cache", "open_partition"]


def open_partition(
    value: Any, cache: MinIOCache | None, cache_dir: Any, samplers: tuple, ahead: int
) -> PartitionedCache | None:
    """The partitioned cache's part of this rank (``partition_cache=``), or None."""
    options = partition_from(value)
    if options is None:
        return None
    check_partition_args(cache, *samplers)
    return PartitionedCache(options, cache_dir, ahead)


def open_cache(
    dataset: SourceDataset, cache_bytes: int | str | None, cache_dir: str | os.PathLike
) -> tuple[MinIOCache | None, str]:
    """The loader's cache (None: none) and, for ``"auto"``, how its capacity was chosen."""
    if cache_bytes is None:
        return None, ""
    sizing = ""
    if cache_bytes == "auto":
        cache_bytes, sizing = auto_capacity(dataset)
        if cache_bytes is None:
            warnings.warn(
                f"cache_bytes='auto' makes no cache ({sizing}); reading from storage",
                RuntimeWarning,
                stacklevel=3,
            )
            return None, sizing
    elif isinstance(cache_bytes, str):
        raise ValueError(f"cache_bytes must be a number of bytes, 'auto' or None, got {cache_bytes!r}")
    try:
        cache = MinIOCache.open(
            fingerprint=dataset.source.fingerprint,
            num_records=len(dataset),
            capacity=cache_bytes,
            cache_dir=cache_dir,
            warn_capacity=not sizing,
        )
    except OSError as exc:  # /dev/shm full or not writable: train on without the cache
        warnings.warn(
            f"the cache in {cache_dir} cannot be made ({exc}); reading from storage only", stacklevel=3
        )
        return None, sizing
    if sizing and cache.capacity != cache_bytes:
        sizing += f"; the cache already held this data with {format_bytes(cache.capacity)} and is used as is"
    return cache, sizing


def auto_capacity(dataset: SourceDataset) -> tuple[int | None, str]:
    """What ``cache_bytes="auto"`` gives: the memory free to take, up to the records and their index."""
    index = index_bytes(len(dataset))
    records = dataset.source.nbytes
    wanted = index + (records if records is not None else 1 << 62)
    capacity, why = auto_cache_bytes(wanted)
    if capacity <= index:
        return None, why
    return capacity, why
