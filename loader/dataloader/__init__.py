"""``loader.DataLoader``: torch's DataLoader, same signature and behaviour, plus a shared MinIO cache.

The class is here; ``opening`` applies its options (the caches and stores they open; a source-backed
dataset's cache, sized and in the form chosen, by ``source_cache``), ``iterators`` runs
torch's iterator classes as the loader needs them (batches counted for resume, a Dataset's own reads served,
the batch ring, ``ready_first``). The ideas they wire sit in loader's other folders.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import torch.utils.data
from torch.utils.data import Dataset, Sampler
from torch.utils.data.dataloader import _DatasetKind

from loader.cache import MinIOCache
from loader.coordinated import Coordination
from loader.coordinated.options import coordination_from
from loader.coordinated.wiring import CoordinatedEpochs
from loader.dataloader.iterators import counting_iterator
from loader.dataloader.opening import open_options
from loader.datasets import SKIPPED
from loader.partition import Partition
from loader.resume.position import ReplayableSampler
from loader.resume.resumable import ResumableEpochs
from loader.serving.files import CachedFiles
from loader.stats.board import StatsBoard
from loader.stats.loader_stats import LoaderStats
from loader.transport.collate import TimedCollate
from loader.transport.ready_first import check_ready_first

__all__ = ["DataLoader"]

_T_co = TypeVar("_T_co", covariant=True)


class DataLoader(ResumableEpochs, torch.utils.data.DataLoader[_T_co]):
    """A drop-in ``torch.utils.data.DataLoader``; with a source-backed dataset it reads through a MinIO cache.

    Keyword-only additions:
      cache_bytes: capacity of the node-local cache in bytes, or ``"auto"``: the memory the job may still
        take (its cgroup's limit or MemAvailable, less a reserve), up to the dataset's size; a number larger
        than that is lowered to it (``stats().cache_sizing`` says why). None (default): no cache, torch's
        behaviour. Shared by every worker and job that reads the same source, it survives the job.
      cache_dir: where it lives, ``$STALLBENCH_CACHE_DIR`` or ``/var/tmp`` (docs/concepts/minio-cache.md).
      cache_form: ``"auto"`` (default) holds records raw, *prepared* (a staged transform's deterministic
        part done: decoded pixels for ``"train"``, the whole sample for ``"eval"``) or mixed, as measured
        fastest, and measured again as the cache fills; ``"raw"`` or ``"prepared"`` forces one
        (docs/concepts/prepared-cache.md).
      on_error: ``"raise"`` (default) stops at a bad record with an error naming it; ``"skip"`` drops it from
        its batch and counts it in ``stats().records_skipped``.
      readahead: the most fetches a worker keeps in flight while it decodes a batch's records, only while
        fetches are slow enough against decode to pay for it (0: always one by one).
      coordinate: True, a group name or a ``loader.Coordination``: jobs on this machine that read the same
        data in the same way prepare each batch once and share it (docs/how-to/hyperparameter-search.md).
      cache_files: the folder (or folders) a Dataset that opens its own files reads from: its plain reads
        of files under them go through a cache of ``cache_bytes`` in every worker, never stale (size and
        mtime checked; docs/how-to/your-own-dataset.md).
      ready_first: batches made of the samples ready first: each batch is dealt to the workers in pieces
        and the main process collates the samples of the pieces in the order they arrive, so a slow sample
        holds only its piece (its samples go into a later batch), not its batch and those after it. Every
        sample still once an epoch; off by default: torch's batches and order (docs/how-to/slow-samples.md).
      partition_cache: True or a ``loader.Partition``: under torch.distributed with a DistributedSampler,
        each node caches its share of the records and sends it to the other nodes ahead of need, so N
        nodes cache N times as much (docs/how-to/multi-node.md).
    With any other dataset it behaves exactly like PyTorch's DataLoader.
    """

    def __init__(
        self,
        dataset: Dataset[_T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Any | None = None,
        batch_sampler: Sampler | Any | None = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        cache_bytes: int | Literal["auto"] | None = None,
        cache_dir: str | os.PathLike | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        readahead: int = 16,
        coordinate: bool | str | Coordination = False,
        partition_cache: bool | Partition = False,
        cache_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
        cache_form: Literal["auto", "raw", "prepared"] = "auto",
        ready_first: bool = False,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if isinstance(readahead, bool) or not isinstance(readahead, int) or readahead < 0:
            raise ValueError(f"readahead must be a number of threads (0 or more), got {readahead!r}")
        coordination = coordination_from(coordinate)
        transform, user_collate = getattr(dataset, "transform", None), collate_fn
        board = StatsBoard(num_workers if isinstance(num_workers, int) and num_workers > 0 else 0)
        opened = open_options(
            dataset,
            collate_fn,
            board,
            coordination,
            batches=(batch_size, batch_sampler, sampler),
            workers=(num_workers, prefetch_factor),
            cache_bytes=cache_bytes,
            cache_dir=cache_dir,
            on_error=on_error,
            readahead=readahead,
            partition_cache=partition_cache,
            cache_files=cache_files,
            cache_form=cache_form,
        )
        self._opened, self._partition, self._files = opened, opened.partition, opened.files
        super().__init__(
            opened.dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            opened.collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self._board = board
        if not isinstance(ready_first, bool):
            raise ValueError(f"ready_first must be True or False, got {ready_first!r}")
        self.ready_first = ready_first
        if self.ready_first:
            check_ready_first(self, coordination is not None or opened.partition is not None)
        drawn_again = self._resumable_kind  # a map-style order; an IterableDataset's comes from the dataset
        self._replay = ReplayableSampler(super()._index_sampler, self._generators) if drawn_again else None
        coordinated = coordination is not None
        self._coordinated = (
            CoordinatedEpochs(self, coordination, transform, user_collate) if coordinated else None
        )

    def __setattr__(self, attr: str, val: Any) -> None:
        """Torch's rules; a sampler a subclass swaps in after ``__init__`` (timm's ``MultiEpochsDataLoader``
        wraps ``batch_sampler`` in an endless one) is the one the epochs are drawn from; one without a length
        is refused where ``coordinate=`` or ``partition_cache=`` plan the epochs from it."""
        if attr not in ("sampler", "batch_sampler"):
            super().__setattr__(attr, val)
            return
        planned = any(getattr(self, name, None) is not None for name in ("_coordinated", "_partition"))
        if planned and not hasattr(val, "__len__"):
            raise TypeError(f"{attr} has no len(): coordinate= and partition_cache= plan each epoch from it")
        super().__setattr__(attr, val)
        if getattr(self, "_replay", None) is not None:
            self._replay.inner = super()._index_sampler

    @property
    def _resumable_kind(self) -> bool:
        return self._dataset_kind == _DatasetKind.Map

    @property
    def _index_sampler(self) -> Any:
        return self._replay if self._replay is not None else super()._index_sampler

    @property
    def cache(self) -> MinIOCache | None:
        """The shared cache this loader reads through, or None."""
        return self._opened.cache

    @property
    def cache_files(self) -> CachedFiles | None:
        """What serves the Dataset's own file reads (``cache_files=``), or None."""
        return self._files.files if self._files is not None else None

    def __iter__(self) -> Any:
        self._board.ensure_workers(self.num_workers)
        if self.num_workers == 0:
            self._board.start_storage_count()
        if self._partition is None:
            return self._batches()
        # every rank's order is read before the epoch is drawn (with workers, making the iterator draws it),
        # where a restored epoch stands; the exchange starts only once the workers are forked: one forked
        # while its threads ran inherited a lock and hung (seen in CI)
        orders = self._replay.next_orders(self.sampler)
        self._partition.end_epoch(self._board.totals())
        batches = self._batches()
        self._partition.start_epoch(orders)
        return batches

    def _batches(self) -> Any:
        coordinated = self._coordinated
        return coordinated.epoch(self._plain_iter) if coordinated is not None else self._plain_iter()

    def _plain_iter(self) -> Any:
        if self._replay is None:
            return super().__iter__()
        # read before the iterator is made: with workers, making it already starts the epoch (prefetch)
        self._delivered, self._started_before = self._replay.next_start(), self._replay.epochs_started
        self._made_iterator = True
        return self._iter_resumed() if self._resume is not None else super().__iter__()

    def _count_delivered(self) -> None:
        super()._count_delivered()
        if self._opened.revisit is not None:
            self._opened.revisit.handed(self._board)

    def _get_iterator(self) -> Any:
        """Torch's own iterator classes, counting the batches handed out (for ``state_dict``) and serving the
        Dataset's own reads (``cache_files``)."""
        if self.num_workers > 0:
            self.check_worker_number_rationality()
        made = self._opened.collate_fn
        if isinstance(made, TimedCollate) and not isinstance(self.collate_fn, TimedCollate):
            # a collate_fn set after __init__ (torch lets it be), timed as one given to it: each batch's
            # collate publishes the counts stats() reads (without it the first epoch's were lost)
            self.collate_fn = TimedCollate(self.collate_fn, made.board, made.batched)
        tracking = self._tracking() if self._replay is not None else None
        return self._workers_started(counting_iterator(self, tracking, skip=SKIPPED, serve=self._files))

    def stats(self) -> LoaderStats:
        """Totals since this loader was made, over all its workers and epochs."""
        stores = self._files.files.infos() if self._files is not None else []
        stores += [store.info() for store in self._opened.stores]
        totals = self._board.totals(stores, self._opened.sizing, self._opened.form_now)
        totals = dataclasses.replace(totals, ready_first=self.ready_first)
        if self._coordinated is not None:
            totals = dataclasses.replace(totals, coordination=self._coordinated.member.stats())
        if self._partition is not None:
            totals = dataclasses.replace(totals, partition=self._partition.stats())
        return totals
