"""The collate step of a source-backed loader: drop skipped records, time collation, report storage reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torch.utils.data._utils.collate import default_collate, default_convert

from loader.datasets import SKIPPED
from loader.stats.board import StatsBoard

__all__ = ["TimedCollate", "timed_collate"]


class TimedCollate:
    """Runs in the worker that built the batch, around the user's (or torch's default) ``collate_fn``."""

    def __init__(self, collate_fn: Callable[[Any], Any], board: StatsBoard, batched: bool) -> None:
        self.collate_fn = collate_fn
        self.board = board
        self.batched = batched

    def __call__(self, data: Any) -> Any:
        if self.batched:
            data = [sample for sample in data if sample is not SKIPPED]
        if data is SKIPPED or (self.batched and not data):
            self.board.flush()
            return SKIPPED  # the loader's iterator drops it
        start = time.perf_counter()
        batch = self.collate_fn(data)
        board = self.board
        board.add("collate_seconds", time.perf_counter() - start)
        board.add("batches_collated", 1)
        board.add("samples", len(data) if self.batched else 1)
        board.flush()
        return batch


def timed_collate(collate_fn: Callable[[Any], Any] | None, board: StatsBoard, batched: bool) -> TimedCollate:
    """The user's ``collate_fn`` (or torch's default for ``batched``), timed into ``board``."""
    return TimedCollate(collate_fn or (default_collate if batched else default_convert), board, batched)
