"""The job's dataset and loader: any format the loader reads, with both loaders instrumented alike."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data._utils.collate import default_collate

__all__ = ["make_dataset", "make_dataset_and_loader", "pad_tokens"]

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


def make_dataset_and_loader(args: argparse.Namespace, transform: Any) -> tuple[Any, Callable[[], Any]]:
    """The job's loader and a function giving its cumulative stats (LoaderStats)."""
    import loader
    from loader._collate import TimedCollate
    from loader.stats import StatsBoard

    dataset = make_dataset(args.data, transform)
    collate = pad_tokens if getattr(dataset.source, "kind", "binary") == "tokens" else default_collate
    common = dict(
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(args.seed),
    )
    if args.loader == "cached":
        dl = loader.DataLoader(
            dataset, collate_fn=collate, cache_bytes=args.cache_bytes, cache_dir=args.cache_dir, **common
        )
        return dl, dl.stats
    board = StatsBoard(args.workers)  # torch's own loader; our dataset and collate only time the stages
    bound = dataset.bind(cache=None, board=board, on_error="raise")
    dl = torch.utils.data.DataLoader(bound, collate_fn=TimedCollate(collate, board, batched=True), **common)
    return dl, lambda: board.totals(None)
