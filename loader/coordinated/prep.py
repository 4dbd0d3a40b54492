"""Preparing the group's batches: claim one, fetch and collate it, stage it; in workers or the main process.

A job's workers get one ticket per epoch each (a map-style dataset of tickets, run by torch's own worker
machinery: ``worker_init_fn``, seeds and start method as the user set them). A ticket keeps claiming until
the job's epoch has nothing left to claim, so a worker never waits on the main process for work.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from typing import Any

import torch.utils.data

from loader.coordinated._batchfile import write_batch
from loader.coordinated.area import DONE, WAIT, Area, LockTimeout

__all__ = ["Preparer", "Tickets"]

_IDLE_PAUSE = (0.0005, 0.005)  # the first and the longest sleep of a process that found nothing to claim


class Preparer(torch.utils.data.Dataset):
    """``self[epoch]`` prepares batches of member ``row``'s epoch until none is left; returns how many."""

    def __init__(self, area: Area, row: int, dataset: Any, collate_fn: Any) -> None:
        self.area, self.row = area, row
        self.dataset, self.collate_fn = dataset, collate_fn
        self._orders: dict[int, list[list[int]]] = {}
        self._main = os.getpid()  # a worker stops when this process is gone

    def __len__(self) -> int:
        return 1 << 62

    def __getitem__(self, epoch: int) -> int:
        limit, made = (epoch + 1) * self.area.num_batches, 0
        pause = _IDLE_PAUSE[0]
        while torch.utils.data.get_worker_info() is None or os.getppid() == self._main:
            try:
                g = self.area.claim(self.row, limit)
            except LockTimeout:  # the table's lock is held by a stopped process: the job goes on alone
                break
            if g == DONE:
                break
            if g == WAIT:
                time.sleep(pause)
                pause = min(pause * 2, _IDLE_PAUSE[1])
                continue
            with contextlib.suppress(Exception):  # staged as failed: each job raises it when it gets there
                self.prepare(g)
            made, pause = made + 1, _IDLE_PAUSE[0]
        return made

    def prepare(self, g: int) -> None:
        """Fetch, collate and stage batch ``g`` (claimed by this process)."""
        try:
            self._prepare(g)
        except BaseException as exc:
            where = f"pid {os.getpid()}"
            self.area.failed_batch(g, f"{where}: {''.join(traceback.format_exception(exc)).rstrip()}")
            raise

    def _prepare(self, g: int) -> None:
        start = time.process_time()
        epoch, b = divmod(g, self.area.num_batches)
        indices = self._order(epoch)[b]
        fetch_many = getattr(self.dataset, "__getitems__", None)
        samples = fetch_many(indices) if fetch_many is not None else [self.dataset[i] for i in indices]
        batch = self.collate_fn(samples)
        tmp = self.area.path / f".b-{g}-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            nbytes = write_batch(fd, batch)
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        self.area.published_batch(g, self.row, tmp, nbytes, time.process_time() - start)

    def _order(self, epoch: int) -> list[list[int]]:
        if epoch not in self._orders:
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = self.area.order(epoch)
        return self._orders[epoch]


class Tickets(torch.utils.data.Sampler[int]):
    """One ticket per worker, each naming the epoch to prepare for (``epoch`` is set before each epoch)."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers, self.epoch = num_workers, 0

    def __iter__(self):
        return iter([self.epoch] * self.num_workers)

    def __len__(self) -> int:
        return self.num_workers
