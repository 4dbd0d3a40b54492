"""What a ``loader.DataLoader`` opens: for a source-backed dataset, its shared cache
(``loader.dataloader.source_cache``) and its rank's part of a partitioned cache (``partition_cache``); for a
Dataset that opens its own files, the store of those files (``cache_files``)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from loader.cache import MinIOCache
from loader.dataloader.source_cache import open_cache
from loader.datasets import SourceDataset
from loader.form.revisit import FormRevisit
from loader.form.weighing import FormChoice
from loader.partition.options import partition_from
from loader.partition.wiring import PartitionedCache, check_partition_args
from loader.serving.files import CachedFiles
from loader.serving.open_hook import FileReads
from loader.stats.board import StatsBoard
from loader.system.home import default_cache_dir
from loader.transport.collate import timed_collate

__all__ = ["Opened", "open_options"]


@dataclasses.dataclass(frozen=True)
class Opened:
    """What the loader's own options made of its arguments: the dataset and collate_fn torch gets."""

    dataset: Any
    collate_fn: Any
    stores: tuple[MinIOCache, ...] = ()  # every store its records are held in: raw first
    sizing: str = ""  # how cache_bytes="auto" chose
    form: FormChoice | None = None  # the form of record the cache holds, and why, as first chosen
    revisit: FormRevisit | None = None  # where the loader chose the form: revisits it as the job runs
    partition: PartitionedCache | None = None
    files: FileReads | None = None

    @property
    def form_now(self) -> FormChoice | None:
        """The form the cache holds now: as last revisited, else as first chosen."""
        return self.revisit.choice if self.revisit is not None else self.form

    @property
    def cache(self) -> MinIOCache | None:
        """The store of raw records, else of prepared ones; None without a cache."""
        return self.stores[0] if self.stores else None


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
    cache_form: str,
) -> Opened:
    """Our options applied: ``cache_files`` for a Dataset that opens its own files; the cache and the
    partition for a source-backed one (``batches``: batch_size, batch_sampler, sampler; ``workers``:
    num_workers, prefetch_factor); for any other Dataset, nothing (torch's loader, as it is)."""
    batch_size, batch_sampler, sampler = batches
    batched = batch_sampler is not None or batch_size is not None
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    if cache_files is not None:
        if cache_form != "auto":
            raise ValueError("cache_form is for a source-backed dataset: cache_files holds raw bytes only")
        files = open_files(dataset, cache_files, cache_bytes, cache_dir, board, coordination)
        timed = timed_collate(collate_fn, board, batched)
        return Opened(dataset, timed, sizing=files.files.cache_sizing, files=files)
    if isinstance(dataset, SourceDataset):
        num_workers, prefetch_factor = workers
        partitioned = partition_from(partition_cache) is not None
        if partitioned and cache_form == "prepared":
            raise ValueError(
                "partition_cache exchanges raw records: it cannot hold them prepared (cache_form)"
            )
        opened = open_cache(
            dataset, cache_bytes, cache_dir, "raw" if partitioned else cache_form, num_workers
        )
        cache = opened.raw
        depth = (num_workers or 1) * (prefetch_factor or 2) + 2  # batches a rank may hold received
        ahead = depth * (batch_size or 1)
        samplers = (sampler, batch_sampler)
        partition = open_partition(partition_cache, cache, cache_bytes, cache_dir, samplers, ahead)
        peers = partition.peers if partition is not None else None
        bound = dataset.bind(
            cache=cache,
            board=board,
            on_error=on_error,
            readahead=readahead,
            peers=peers,
            prepared=opened.prepared,
        )
        if partition is not None:
            partition.serve_from(bound)
        timed = timed_collate(collate_fn, board, batched)
        return Opened(bound, timed, opened.stores, opened.sizing, opened.form, opened.revisit, partition)
    if cache_form != "auto":
        raise ValueError(f"cache_form needs a source-backed dataset, not {type(dataset).__name__}")
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
    value: Any, cache: MinIOCache | None, cache_bytes: Any, cache_dir: Any, samplers: tuple, ahead: int
) -> PartitionedCache | None:
    """The partitioned cache's part of this rank (``partition_cache=``), or None."""
    options = partition_from(value)
    if options is None:
        return None
    check_partition_args(cache, cache_bytes, cache_dir, *samplers)
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
