"""The loader kinds stallbench runs and compares, by name: the one registry of them.

The command line's choices, the what-if model, the reports and the generated job
(``stallbench.jobs.workload``, which builds its loader here) all read it. Nothing is imported at import time
beyond the standard library: the command line and the bootstrap read the names before torch is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stallbench.jobs.spec import WorkloadJob

__all__ = [
    "CACHED",
    "DEFAULT",
    "KINDS",
    "NAMES",
    "SWAPPABLE",
    "TORCH",
    "LoaderKind",
    "check_kind",
    "kind_of_class",
]

Build = Callable[..., Any]  # (dataset, collate, job, **DataLoader options) -> the loader

TORCH, CACHED = "torch", "cached"
# the other loaders (``stallbench.jobs.others``)
LITDATA, STREAMING, WEBDATASET = "litdata", "streaming", "webdataset"


@dataclass(frozen=True)
class LoaderKind:
    """One kind of loader: its name, the class whose batches it hands out, and how a job builds it."""

    name: str
    label: str  # the class, as a LoaderEpoch's ``loader_class`` names it
    cached: bool  # our minimal-miss cache: takes cache_bytes and cache_dir, counts hits; else the page cache
    build: Build  # how a generated job makes its loader; its stage counters, where timed, on the loader
    converts: bool = False  # reads the data converted with its own tool (``others.convert``), not as it is


def _torch(dataset: Any, collate: Callable, job: WorkloadJob, **common: Any) -> Any:
    """torch's own DataLoader; our dataset and a timed collate only time the stages, as in ours. It has no
    group: N torch jobs are N independent loaders, each preparing every batch (``coordinate`` ignored)."""
    import torch

    from loader.instrument import StatsBoard, TimedCollate
    from stallbench.jobs.spec import GENERATED_STATS

    board = StatsBoard(job.workers)
    bound = dataset.bind(cache=None, board=board, on_error="raise")
    timed = TimedCollate(collate, board, batched=True)
    dl = torch.utils.data.DataLoader(bound, collate_fn=timed, **common)
    setattr(dl, GENERATED_STATS, board.totals)  # what the measuring reads, as ours' stats()
    return dl


def _cached(dataset: Any, collate: Callable, job: WorkloadJob, **common: Any) -> Any:
    """Our DataLoader, with the job's cache, sharing its prepared batches with its group when it has one.

    The group's staging area goes in the cache's folder: a run that makes a private one for its jobs
    (``compare --jobs``) removes both with it, even after killing jobs that could not leave the group."""
    import loader

    coordinate = False
    if job.coordinate:
        staging = {"staging_dir": job.cache_dir} if job.cache_dir is not None else {}
        coordinate = loader.Coordination(group=job.coordinate, min_members=job.group_size, **staging)
    dl = loader.DataLoader(
        dataset,
        collate_fn=collate,
        cache_bytes=job.cache_bytes,
        cache_dir=job.cache_dir,
        coordinate=coordinate,
        **common,
    )
    return dl


def _litdata(*args: Any, **common: Any) -> Any:
    from stallbench.jobs.others import build_litdata

    return build_litdata(*args, **common)


def _streaming(*args: Any, **common: Any) -> Any:
    from stallbench.jobs.others import build_streaming

    return build_streaming(*args, **common)


def _webdataset(*args: Any, **common: Any) -> Any:
    from stallbench.jobs.others import build_webdataset

    return build_webdataset(*args, **common)


KINDS: dict[str, LoaderKind] = {
    kind.name: kind
    for kind in (
        LoaderKind(TORCH, "torch.utils.data.DataLoader", cached=False, build=_torch),
        LoaderKind(CACHED, "loader.DataLoader", cached=True, build=_cached),
        LoaderKind(LITDATA, "litdata.StreamingDataLoader", cached=False, build=_litdata, converts=True),
        LoaderKind(STREAMING, "streaming.StreamingDataLoader", cached=False, build=_streaming, converts=True),
        LoaderKind(WEBDATASET, "webdataset.WebDataset", cached=False, build=_webdataset, converts=True),
    )
}
NAMES: tuple[str, ...] = tuple(KINDS)  # the baseline first
DEFAULT: tuple[str, ...] = (TORCH, CACHED)  # what ``compare`` and the demo put side by side unless told
SWAPPABLE: tuple[str, ...] = tuple(k.name for k in KINDS.values() if not k.converts)  # into a user's command


def check_kind(name: str) -> LoaderKind:
    """The kind called ``name``; ValueError naming the choices for any other."""
    if name not in KINDS:
        raise ValueError(f"unknown loader {name!r}; choose one of: {', '.join(NAMES)}")
    return KINDS[name]


def kind_of_class(label: str) -> str:
    """The kind whose batches a loader of class ``label`` hands out: a class not ours counts as torch's."""
    return next((k.name for k in KINDS.values() if k.label == label), TORCH)
