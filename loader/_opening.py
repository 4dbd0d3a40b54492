"""What a ``loader.DataLoader`` opens: for a source-backed dataset, its shared cache (``cache_bytes``, "auto"
included) and its rank's part of a partitioned cache (``partition_cache``); for a Dataset that opens its own
files, the store of those files (``cache_files``)."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

from loader._serving import FileReads
from loader.cache import MinIOCache
from loader.cache._layout import index_bytes
from loader.collate import timed_collate
from loader.datasets import SourceDataset
from loader.files import CachedFiles
from loader.partition.options import partition_from
from loader.partition.wiring import PartitionedCache, check_partition_args
from loader.stats import StatsBoard
from loader.system.headroom import auto_cache_bytes
from loader.system.memory import format_bytes

__all__ = ["Opened", "auto_capacity", "open_cache", "open_options"]


@dataclasses.dataclass(frozen=True)
class Opened:
    """What the loader's own options made of its arguments: the dataset and collate_fn torch gets."""

    dataset: Any
    collate_fn: Any
    cache: MinIOCache | None = None
    sizing: str = ""  # how cache_bytes="auto" chose
    partition: PartitionedCache | None = None
    files: FileReads | None = None


def open_options(
    dataset: Any,
    collate_fn: Any,
    board: StatsBoard,
    coordination: Any,
    *,
    batches: tuple[Any, Any, Any],
    workers: tuple[Any, Any],
    cache_bytes: int | str | None,
    cache_dir: Any,
    on_error: str,
    readahead: int,
    partition_cache: Any,
    cache_files: Any,
) -> Opened:
    """Our options applied: ``cache_files`` for a Dataset that opens its own files; the cache and the
    partition for a source-backed one (``batches``: batch_size, batch_sampler, sampler; ``workers``:
    num_workers, prefetch_factor); for any other Dataset, nothing (torch's loader, as it is)."""
    batch_size, batch_sampler, sampler = batches
    batched = batch_sampler is not None or batch_size is not None
    if cache_files is not None:
        files = open_files(dataset, cache_files, cache_bytes, cache_dir, board, coordination)
        timed = timed_collate(collate_fn, board, batched)
        return Opened(dataset, timed, sizing=files.files.cache_sizing, files=files)
    if isinstance(dataset, SourceDataset):
        cache, sizing = open_cache(dataset, cache_bytes, cache_dir)
        num_workers, prefetch_factor = workers
        depth = (num_workers or 1) * (prefetch_factor or 2) + 2  # batches a rank may hold received
        ahead = depth * (batch_size or 1)
        partition = open_partition(partition_cache, cache, cache_dir, (sampler, batch_sampler), ahead)
        peers = partition.peers if partition is not None else None
        bound = dataset.bind(cache=cache, board=board, on_error=on_error, readahead=readahead, peers=peers)
        if partition is not None:
            partition.serve_from(bound)
        return Opened(bound, timed_collate(collate_fn, board, batched), cache, sizing, partition)
    if partition_from(partition_cache) is not None:
        raise ValueError(f"partition_cache needs a source-backed dataset, not {type(dataset).__name__}")
    if cache_bytes is not None:
        warnings.warn(
            f"cache_bytes is ignored: {type(dataset).__name__} is not a source-backed dataset; "
            "to serve the files it opens itself through the cache, name their folder with cache_files=",
            stacklevel=3,
        )
    return Opened(dataset, collate_fn)


def open_partition(
    value: Any, cache: MinIOCache | None, cache_dir: Any, samplers: tuple, ahead: int
) -> PartitionedCache | None:
    """The partitioned cache's part of this rank (``partition_cache=``), or None."""
    options = partition_from(value)
    if options is None:
        return None
    check_partition_args(cache, *samplers)
    return PartitionedCache(options, cache_dir, ahead)


def open_files(
    dataset: Any,
    cache_files: Any,
    cache_bytes: int | str | None,
    cache_dir: Any,
    board: StatsBoard,
    coordination: Any,
) -> FileReads:
    """The store that serves the reads of a Dataset that opens its own files (``cache_files=``)."""
    if isinstance(dataset, SourceDataset):
        raise ValueError(
            f"cache_files is for a Dataset that opens its own files; {type(dataset).__name__} is "
            "source-backed: cache_bytes alone caches its records"
        )
    if cache_bytes is None:
        raise ValueError("cache_files needs a cache: set cache_bytes (a number of bytes or 'auto')")
    if coordination is not None:
        raise ValueError(
            "cache_files cannot serve a coordinated group's reads: drop coordinate or cache_files"
        )
    return FileReads(CachedFiles(cache_files, cache_bytes, cache_dir), board)


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
