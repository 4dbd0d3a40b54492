"""A DataLoader's coordinated mode: its group from its arguments, and one epoch through the group."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.utils.data
from torch.utils.data._utils.pin_memory import pin_memory

from loader.coordinated.area import Area
from loader.coordinated.member import Member
from loader.coordinated.options import Coordination, group_key
from loader.coordinated.prep import Preparer, Tickets
from loader.system.home import default_cache_dir
from loader.system.private import user_dir

__all__ = ["CoordinatedEpochs"]


class CoordinatedEpochs:
    """What ``DataLoader(coordinate=...)`` adds: ``epoch(plain)`` yields one epoch's batches."""

    def __init__(
        self, loader: torch.utils.data.DataLoader, options: Coordination, transform: Any, collate: Any
    ) -> None:
        self._loader = weakref.ref(loader)
        batches = loader.batch_sampler
        if batches is None:
            raise ValueError(
                "coordinate needs batches: set batch_size (or a batch_sampler), not batch_size=None"
            )
        if not isinstance(loader.dataset, torch.utils.data.Dataset) or isinstance(
            loader.dataset, torch.utils.data.IterableDataset
        ):
            raise ValueError("coordinate needs a map-style dataset: an IterableDataset has no order to share")
        key = group_key(
            _data_identity(loader.dataset, options.group),
            order=_order_identity(loader),
            batch_size=(loader.batch_size, loader.drop_last),
            transform=transform,
            collate_fn=collate,
            name=options.group,
        )
        staging = Path(options.staging_dir) if options.staging_dir is not None else default_cache_dir()
        area = user_dir(staging, "Coordination(staging_dir=...)", key)
        self.area = Area(area.parent, area.name, len(batches), options.staged_batches, options.patience)
        self.member = Member(
            self.area, options, Preparer(self.area, 0, loader.dataset, loader.collate_fn), loader.num_workers
        )
        self._prep_loader: torch.utils.data.DataLoader | None = None
        self._prep_seed = 0  # the prep workers' own generator's seed: the job's first base seed
        weakref.finalize(loader, self.member.leave)

    @property
    def loader(self) -> torch.utils.data.DataLoader:
        """The loader this serves, held weakly: it holds this, and a cycle between them would leave the prep
        workers' iterator to the cyclic collector, which may close the iterator's queues before the iterator
        tells its workers to stop; torch then waits 5 s for each worker (measured: 10.2 s to drop a loader
        with 2 persistent workers, 0.1 s without the cycle)."""
        loader = self._loader()
        if loader is None:
            raise ReferenceError("the DataLoader this coordination served is gone")
        return loader

    def epoch(self, plain: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        loader = self.loader
        pin = loader.pin_memory and torch.cuda.is_available()
        # torch's iterator draws its workers' base seed before the sampler draws the order (persistent
        # workers: the first epoch only); the same draws here give torch's order for the same generator
        if not (loader.persistent_workers and self._prep_loader is not None):
            base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator))
            self._prep_seed = self._prep_seed or base_seed
        batches = self.member.epoch(
            draw_order=lambda: [list(b) for b in loader.batch_sampler],
            plain=plain,
            alone=self._alone,
            start_prep=self._start_prep,
        )
        for batch in batches:
            yield pin_memory(batch, loader.pin_memory_device or None) if pin else batch

    def _start_prep(self, epoch: int) -> Iterator[Any] | None:
        """The workers' tickets for ``epoch`` (None without workers: the main process prepares)."""
        loader = self.loader
        if loader.num_workers == 0:
            return None
        if self._prep_loader is None:
            self._prep_loader = torch.utils.data.DataLoader(
                self.member.preparer,
                batch_size=None,
                sampler=Tickets(loader.num_workers),
                num_workers=loader.num_workers,
                worker_init_fn=loader.worker_init_fn,
                multiprocessing_context=loader.multiprocessing_context,
                generator=torch.Generator().manual_seed(self._prep_seed),  # the user's draws are made above
                prefetch_factor=1,
                persistent_workers=loader.persistent_workers,
            )
        self._prep_loader.sampler.epoch = epoch
        return iter(self._prep_loader)

    def _alone(self, batches: list[list[int]]) -> Iterator[Any]:
        """The rest of an epoch this job finishes alone, with workers like its own."""
        loader = self.loader
        alone = torch.utils.data.DataLoader(
            loader.dataset,
            batch_sampler=batches,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            generator=loader.generator,
            prefetch_factor=loader.prefetch_factor,
            pin_memory_device=loader.pin_memory_device,
        )
        return iter(alone)


def _data_identity(dataset: Any, group: str | None) -> str:
    source = getattr(dataset, "source", None)
    fingerprint = getattr(source, "fingerprint", None)
    if isinstance(fingerprint, str):
        return fingerprint
    if group is None:
        raise ValueError(
            f"coordinate=True cannot tell which jobs read the same {type(dataset).__name__}: use a "
            "source-backed dataset (loader.ImageFolder, LMDBDataset, ArrowDataset, SourceDataset), or name "
            "the group, as in coordinate='my-search', in every job that reads the same data"
        )
    return f"{type(dataset).__module__}.{type(dataset).__qualname__}:{len(dataset)}"


def _order_identity(loader: torch.utils.data.DataLoader) -> str:
    """The kind of sampler and, where one was given, its generator's seed (without: the group's first job
    draws each epoch's order)."""
    sampler, batches = loader.sampler, loader.batch_sampler
    generator = getattr(sampler, "generator", None) or loader.generator
    seed = generator.initial_seed() if generator is not None else "drawn by the group"
    return f"{type(batches).__qualname__}/{type(sampler).__qualname__}/seed={seed}"
