"""A generated job's dataset and loader: any format the loader reads, every loader kind instrumented alike
(the kind builds it: ``stallbench.jobs.kinds``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import default_collate

from stallbench.jobs.kinds import KINDS
from stallbench.jobs.spec import WorkloadJob

__all__ = ["make_dataset", "make_loader", "pad_tokens"]

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc", ".parquet")


def make_dataset(data: str | Path, transform: Any) -> Any:
    """An image folder, an LMDB folder (has data.mdb) or an Arrow/Parquet file, as a SourceDataset."""
    import loader

    path = Path(data)
    if path.is_dir() and (path / "data.mdb").exists():
        return loader.LMDBDataset(str(path), transform=transform)
    if path.suffix.lower() in ARROW_SUFFIXES:
        source = loader.ArrowSource(path)
        labels = "label" if "label" in source.columns else None
        transform = transform if source.kind == "binary" else None  # image transforms do not apply to tokens
        return loader.ArrowDataset(str(path), column=source.column, label_column=labels, transform=transform)
    return loader.ImageFolder(str(path), transform=transform)


def pad_tokens(batch: list[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences of different lengths -> (right-padded int64 [B, longest], lengths)."""
    lengths = torch.tensor([len(t) for t, _ in batch])
    padded = torch.zeros(len(batch), int(lengths.max(initial=0)), dtype=torch.int64)
    for row, (tokens, _) in enumerate(batch):
        padded[row, : len(tokens)] = tokens
    return padded, lengths


def make_loader(job: WorkloadJob, transform: Any) -> tuple[Any, Callable[[], Any]]:
    """The job's loader and a function giving its cumulative stats (LoaderStats)."""
    dataset = make_dataset(job.data, transform)
    collate = pad_tokens if getattr(dataset.source, "kind", "binary") == "tokens" else default_collate
    generator = torch.Generator().manual_seed(job.seed)
    order = _cut_order(dataset, job, generator)
    return KINDS[job.loader].build(
        dataset, collate, job, batch_size=job.batch_size, shuffle=order is None, sampler=order,
        num_workers=job.workers, persistent_workers=job.workers > 0, generator=generator,
    )  # fmt: skip


def _cut_order(dataset: Any, job: WorkloadJob, generator: torch.Generator) -> Any:
    """With ``max_batches``, an epoch of exactly that many random batches (None: the whole shuffled
    dataset). Drawn by the sampler, not cut by a ``break``: persistent workers would go on reading the
    batches already asked for, and the next epoch would count those reads."""
    samples = (job.max_batches or 0) * job.batch_size
    if job.mode != "pipeline" or not 0 < samples < len(dataset):
        return None
    return torch.utils.data.RandomSampler(dataset, num_samples=samples, generator=generator)
