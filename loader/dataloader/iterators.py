"""Torch's own iterator classes, as ``loader.DataLoader`` runs them: each batch handed to the training loop is
told to the loader (``loader.resume.tracking``), a batch that is only ``skip`` (all its records bad and
skipped) is dropped, a Dataset's own file reads are served (``cache_files``), a restored loader's workers
start where the saved ones were, batches are made of the samples ready first where asked
(``loader.transport.ready_first``), and what a killed worker left of torch's shared memory in /dev/shm is
removed.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from torch.utils.data import _utils
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

from loader.cache._attached import make_room_for_workers
from loader.resume.tracking import Tracking
from loader.resume.worker_random import RestoringWorkerInit, StampingCollate
from loader.serving.open_hook import FileReads, ServingWorkerInit, serving
from loader.system.forkgrowth import measure_growth
from loader.transport.collated_pieces import piece_collate, samples_apart
from loader.transport.dead_workers import forget_segments_of_failed
from loader.transport.ready_first import PIECES, ReadyFirst, one_index_queue
from loader.transport.ring_collate import ring_collate
from loader.transport.shared_heap import heap_ready_for_fork

__all__ = ["counting_iterator"]

REAP_WAIT_S = 1.0  # how long a broken connection to the workers waits for a dying one to be reaped


class _Counting:
    _tracking: Tracking | None = None
    _skip: Any = None

    def __next__(self) -> Any:
        batch = self._handed(super().__next__())
        while self._skip is not None and batch is self._skip:
            batch = self._handed(super().__next__())
        return batch

    def _handed(self, batch: Any) -> Any:
        return batch if self._tracking is None else self._tracking.handed(batch)


class _CountingSingleProcessIter(_Counting, _SingleProcessDataLoaderIter):
    _serve: Any = None  # a loader's cache_files reads, served while this process loads a batch

    def _next_data(self) -> Any:
        if self._serve is None:
            return super()._next_data()
        with serving(self._serve):
            return super()._next_data()


class _CountingMultiProcessingIter(_Counting, _MultiProcessingDataLoaderIter):
    """Torch deals an epoch's batches to the workers in turn from worker 0; ``_turn`` starts the first
    epoch's deal further on (torch makes the deal's cycle anew each epoch, through this attribute). It seeds
    the workers it starts from the base seed it draws; ``_seed`` is taken instead where given."""

    _turn = 0
    _seed: int | None = None

    @property
    def _base_seed(self) -> int:
        return self._started_from

    @_base_seed.setter
    def _base_seed(self, drawn: int) -> None:
        self._started_from = drawn if self._seed is None else self._seed

    def __next__(self) -> Any:
        try:
            return super().__next__()
        except RuntimeError:  # torch's SIGCHLD handler names a dead worker wherever the main process is
            forget_segments_of_failed(self._workers)
            raise

    def _try_get_data(self, timeout: float = _utils.MP_STATUS_CHECK_INTERVAL) -> tuple[bool, Any]:
        """Torch's, naming a worker that died while the main process took a tensor's descriptor from it as
        torch names a dead worker: the connection breaks (``EOFError``, ``ConnectionError``) a moment before
        the kernel lets the worker be reaped, and torch, finding every worker alive still, raises the bare
        error."""
        try:
            return super()._try_get_data(timeout)
        except (EOFError, ConnectionError) as broken:
            dead = self._workers_dead_within(REAP_WAIT_S)
            if not dead:
                raise
            pids = ", ".join(str(self._workers[i].pid) for i in dead)
            raise RuntimeError(f"DataLoader worker (pid(s) {pids}) exited unexpectedly") from broken

    def _workers_dead_within(self, seconds: float) -> list[int]:
        """The ids of the running workers found dead within ``seconds``, each marked so as torch marks one."""
        deadline = time.monotonic() + seconds
        while True:
            dead = [i for i, w in enumerate(self._workers) if self._workers_status[i] and not w.is_alive()]
            if dead or time.monotonic() >= deadline:
                for worker_id in dead:
                    self._mark_worker_as_unavailable(worker_id)
                return dead
            time.sleep(0.01)

    def _mark_worker_as_unavailable(self, worker_id: int, shutdown: bool = False) -> None:
        super()._mark_worker_as_unavailable(worker_id, shutdown)
        if not shutdown:  # a worker found dead
            forget_segments_of_failed([self._workers[worker_id]])

    def _shutdown_workers(self) -> None:
        """Torch's, after noting what the workers took (``forkgrowth``): the next workers may fork after
        these have gone, as those of a loader without persistent workers do each epoch."""
        exiting = getattr(_utils, "python_exit_status", None) is not False  # (None: torch's module gone)
        try:
            if not getattr(self, "_shutdown", True) and not exiting:
                measure_growth()
        finally:  # an interrupt while measuring still shuts the workers down
            super()._shutdown_workers()
        if not exiting:  # (at the interpreter's exit torch leaves its workers be, and modules are going)
            forget_segments_of_failed(getattr(self, "_workers", ()))

    @property
    def _worker_queue_idx_cycle(self) -> Any:
        return self._deal

    @_worker_queue_idx_cycle.setter
    def _worker_queue_idx_cycle(self, cycle: Any) -> None:
        for _ in range(self._turn):
            next(cycle)
        self._turn, self._deal = 0, cycle


class _ReadyFirstIter(ReadyFirst, _CountingMultiProcessingIter):
    """Batches of the samples ready first (``ready_first=True``)."""


def counting_iterator(
    loader: Any, tracking: Tracking | None, skip: Any, serve: FileReads | None = None
) -> Any:
    """Torch's iterator for ``loader`` (an instance of torch's own class), telling ``tracking`` (if any) of
    each batch; ``serve``'s reads are served in its workers, or without workers while it loads each batch."""
    if loader.num_workers == 0:
        iterator = _CountingSingleProcessIter(loader)
        iterator._serve = serve
    else:
        iterator = _with_workers(loader, tracking, serve)
    iterator._tracking, iterator._skip = tracking, skip
    return iterator


def _with_workers(loader: Any, tracking: Tracking | None, serve: FileReads | None) -> Any:
    """The iterator, its workers started with the loader's ``worker_init_fn`` and ``collate_fn`` wrapped
    (read as the workers start; the loader's own are put back)."""
    user_init, user_collate = loader.worker_init_fn, loader.collate_fn
    init: Callable[[int], Any] | None = (
        ServingWorkerInit(serve, user_init) if serve is not None else user_init
    )
    ready_first = getattr(loader, "ready_first", False)
    kind = _ReadyFirstIter if ready_first else _CountingMultiProcessingIter
    iterator = kind.__new__(kind)
    ring = ring_collate(loader, PIECES if ready_first else 1)
    if ready_first:  # the main process's collate None: it joins the pieces the workers collated
        pieces = piece_collate(user_collate)
        loader.collate_fn, iterator._collate = (
            samples_apart(user_collate) if pieces is None else (pieces, None)
        )
    if ring is not None:
        iterator._batch_ring, loader.collate_fn = ring
        weakref.finalize(iterator, ring[0].close)
    if tracking is not None:
        init = RestoringWorkerInit(tracking.restore, init) if tracking.restore else init
        loader.collate_fn = StampingCollate(loader.collate_fn)
        iterator._turn, iterator._seed = tracking.turn, tracking.seed
    loader.worker_init_fn = init
    make_room_for_workers(loader.num_workers)
    try:
        with heap_ready_for_fork(), one_index_queue(loader, ready_first):
            iterator.__init__(loader)
    finally:
        loader.worker_init_fn, loader.collate_fn = user_init, user_collate
    return iterator
