"""``DataLoader(ready_first=True)``: batches made of the samples ready first, so a slow sample holds no batch.

Torch deals each batch whole to one worker and hands batches out in order: one sample that takes 50 times the
others (a huge image, a slow read) holds its batch, and every batch after it, while the other workers run out
of work (head-of-line blocking; Lotus measured 5-15% of batch time from it). MinatoLoader builds batches from
the samples that are ready and finishes slow ones in the background. Here each batch of the sampler is dealt
to the workers in ``PIECES`` pieces through one queue that every worker reads, so a piece goes to whichever
worker is free, and the main process makes each batch of ``batch_size`` from the samples of the pieces in the
order they arrive (``loader.transport.collated_pieces``: collated in the workers and joined, or collated there
with the loader's own ``collate_fn``). A slow sample holds only its piece, whose samples go into a later
batch; every sample is still handed out once an epoch, and every batch but the epoch's last has ``batch_size``
samples (the last the rest, unless ``drop_last``).

The price: the batches' make-up depends on timing (not torch's order), so does which worker prepares a
sample (a random augmentation drawn in the workers differs from run to run); the pieces do not go through
the batch ring, and the main process joins them (a copy of each batch) or collates. Off by default.
Written by hand: torch has no such dispatch, and the peers that have one (MinatoLoader) are not libraries.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import _utils
from torch.utils.data.dataloader import _DatasetKind

from loader.datasets import SKIPPED
from loader.transport.collated_pieces import cut, joined, rows
from loader.transport.dead_workers import forget_segments_of_failed

__all__ = ["PIECES", "ReadyFirst", "check_ready_first", "one_index_queue"]

PIECES = 4  # a batch is dealt in this many pieces: a slow sample holds back a quarter of a batch's samples


def check_ready_first(loader: Any, planned: bool) -> None:
    """Refuse ``ready_first=True`` where there is no batch of samples to make, or where the epoch's batches
    are planned (``planned``: ``coordinate=``, ``partition_cache=``): ValueError naming why."""
    if planned:
        raise ValueError("ready_first=True cannot go with coordinate= or partition_cache=: they plan batches")
    if loader.num_workers == 0:
        raise ValueError("ready_first=True needs workers (num_workers > 0): without them no sample overtakes")
    if loader.batch_size is None:
        raise ValueError(
            "ready_first=True needs batch_size (a batch_sampler's batches are kept as the sampler made them)"
        )
    if loader._dataset_kind == _DatasetKind.Iterable:
        raise ValueError("ready_first=True needs a map-style dataset: an IterableDataset makes its batches")


class ReadyFirst:
    """Mixed in before torch's multiprocessing iterator: pieces out, batches of the samples ready first in.
    ``_collate``: None where the workers collate the pieces (``piece_collate``), else the loader's
    ``collate_fn``, for the samples the workers hand on (``PieceSamples``)."""

    _collate: Any

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        if not first_iter:
            self._drain()
        self._prefetch_factor = loader.prefetch_factor * PIECES  # as many samples ahead as whole batches
        self._in_order = False  # a piece handed on as it arrives
        self._batch_size = loader.batch_size
        self._pieces: collections.deque[list[int]] = collections.deque()
        self._ready: collections.deque[tuple[Any, int]] = collections.deque()  # (piece, its samples) come
        self._ready_rows = 0
        super()._reset(loader, first_iter)  # type: ignore[misc]

    def _drain(self) -> None:
        """Receive and drop the pieces of an epoch left before its end (a loop's ``break``), before torch
        restarts persistent workers: with one index queue, a worker may take every worker's restart while
        another still makes an old piece, which would come in the new epoch (torch's queue per worker keeps
        each worker's old pieces before its restart)."""
        while self._tasks_outstanding > 0:  # type: ignore[has-type]
            self._get_data()  # type: ignore[attr-defined]
            self._tasks_outstanding -= 1

    def _mark_worker_as_unavailable(self, worker_id: int, shutdown: bool = False) -> None:
        """Torch's, but a worker found dead is only marked: torch also puts ``None`` in its index queue, to
        end a worker whose IterableDataset ran out, and in the one queue every worker reads a live worker
        would take it and fail."""
        if shutdown:
            super()._mark_worker_as_unavailable(worker_id, shutdown)  # type: ignore[misc]
            return
        self._workers_status[worker_id] = False  # type: ignore[attr-defined]
        forget_segments_of_failed([self._workers[worker_id]])  # type: ignore[attr-defined]

    def _next_index(self) -> list[int]:
        while not self._pieces:
            batch = list(super()._next_index())  # type: ignore[misc]  # StopIteration: the epoch is dealt
            size = -(-len(batch) // PIECES)
            self._pieces.extend(batch[start : start + size] for start in range(0, len(batch), size))
        return self._pieces.popleft()

    def _next_data(self) -> Any:
        while self._ready_rows < self._batch_size:
            try:
                piece = super()._next_data()  # type: ignore[misc]
            except StopIteration:
                if not self._ready:
                    raise
                break
            tracking = self._tracking  # type: ignore[attr-defined]
            piece = piece if tracking is None else tracking.unstamped(piece)
            if piece is SKIPPED:  # every record of the piece bad and skipped (``on_error="skip"``)
                continue
            size = len(piece) if self._collate is not None else rows(piece)
            self._ready.append((piece, size))
            self._ready_rows += size
        batch = self._batch_of_ready()
        if self._pin_memory:  # type: ignore[attr-defined]
            batch = _utils.pin_memory.pin_memory(batch, self._pin_memory_device)  # type: ignore[attr-defined]
        return batch

    def _batch_of_ready(self) -> Any:
        """``batch_size`` samples (or the epoch's rest) of the pieces come, in the order they came; a piece
        with more than the batch's room is cut, its rest the next batch's first."""
        samples = self._collate is not None
        parts, room = [], self._batch_size
        while room and self._ready:
            piece, size = self._ready.popleft()
            if size > room:
                self._ready.appendleft((piece[room:] if samples else cut(piece, room, size), size - room))
                piece, size = (piece[:room] if samples else cut(piece, 0, room)), room
            parts.append(piece)
            room -= size
        self._ready_rows -= self._batch_size - room
        if samples:
            return self._collate([sample for part in parts for sample in part])
        return joined(parts)


@contextlib.contextmanager
def one_index_queue(loader: Any, shared: bool) -> Iterator[None]:
    """While torch's iterator starts its workers (``shared``): every worker reads its pieces from one queue
    (``_OneIndexQueue``), the loader's context put back after."""
    if not shared:
        yield
        return
    attribute = "_DataLoader__multiprocessing_context"  # torch's setter takes no wrapper: set behind it
    context = getattr(loader, attribute)
    setattr(loader, attribute, _OneIndexQueue(context or torch.multiprocessing))
    try:
        yield
    finally:
        setattr(loader, attribute, context)


class _OneIndexQueue:
    """A multiprocessing context whose ``Queue()`` is one queue for every worker after its first call (torch
    makes its result queue first): a free worker takes the next piece, so no piece waits in the queue of a
    worker held by a slow sample. Torch's end of an epoch still works: each worker takes one of the
    ``None`` put for each, and a persistent worker's restart, which recreates a map-style fetcher, may be
    taken twice by one worker."""

    def __init__(self, context: Any) -> None:
        self.context, self.made, self.shared = context, 0, None

    def Queue(self) -> Any:  # (multiprocessing's name)
        self.made += 1
        if self.made == 1:
            return self.context.Queue()
        if self.shared is None:
            self.shared = self.context.Queue()
        return self.shared

    def __getattr__(self, name: str) -> Any:
        return getattr(self.context, name)
