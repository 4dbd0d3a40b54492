"""A DataLoader's partitioned cache, in its main process: the group, the nodes, the inbox, the exchange."""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.utils.data import DistributedSampler

from loader.cache import MinIOCache
from loader.partition.exchange import Exchange
from loader.partition.inbox import Inbox
from loader.partition.options import Partition
from loader.partition.peers import PeerRecords
from loader.partition.plan import Layout
from loader.partition.split import Split, SplitChooser
from loader.stats.loader_stats import LoaderStats
from loader.system.private import user_dir

__all__ = ["PartitionedCache", "check_partition_args"]


def check_partition_args(
    cache: MinIOCache | None, cache_bytes: Any, cache_dir: Any, sampler: Any, batch_sampler: Any
) -> None:
    """What ``partition_cache`` needs, checked before anything is made."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "partition_cache needs torch.distributed: start the job with torchrun and call "
            "torch.distributed.init_process_group() before making the DataLoader"
        )
    if cache is None and cache_bytes is None:
        raise ValueError("partition_cache needs a cache: set cache_bytes (each node caches its share)")
    if cache is None:
        raise ValueError(
            f"partition_cache needs a cache, and none could be made in cache_dir={str(cache_dir)!r} with "
            f"cache_bytes={cache_bytes!r} (the warning above says why)"
        )
    if batch_sampler is not None or not isinstance(sampler, DistributedSampler):
        raise ValueError(
            "partition_cache needs sampler=DistributedSampler(...) (and no batch_sampler): every node "
            "computes the others' order from it, ahead of need"
        )


class PartitionedCache:
    """This rank's part: ``peers`` goes to the workers' dataset, which ``serve_from`` then names (the node
    serves its records through it, cache first); ``end_epoch`` before each epoch's workers start,
    ``start_epoch`` once they have."""

    def __init__(self, options: Partition, cache_dir: str | os.PathLike, ahead: int) -> None:
        self._dataset: Any = None
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=options.timeout))
        places: list[Any] = [None] * dist.get_world_size(self.group)
        place = (socket.gethostname(), os.path.realpath(cache_dir))
        dist.all_gather_object(places, place, group=self.group)
        self.layout = Layout.from_places(places, dist.get_rank(self.group))
        parent = user_dir(Path(cache_dir), "cache_dir")
        self.inbox = Inbox.make(parent, self.layout.rank)
        self.peers = PeerRecords(self.layout, self.inbox, options.timeout)
        self.read_to_serve = 0  # bytes this rank read from storage to send to other nodes
        self._lock = threading.Lock()
        ahead = options.ahead or ahead  # per other node
        self.exchange = Exchange(
            self.group, self.layout, self.inbox, self._read_owned, ahead * (self.layout.nodes - 1)
        )
        self._said_gone: set[int] = set()
        self._chooser, self._split = SplitChooser(), Split()
        self._seen = (0, 0)  # bytes read from storage for this node, and received, before this epoch
        weakref.finalize(self, self.inbox.remove)

    def end_epoch(self, stats: LoaderStats) -> None:
        """The last epoch's exchange is over: call before the next epoch's workers start, with the loader's
        ``stats``. The next epoch's split is chosen from what the last one measured and published for the
        workers."""
        self.exchange.end_epoch()
        with self._lock:
            read = stats.bytes_from_source + self.read_to_serve
        seen, self._seen = self._seen, (read, self.exchange.counts["bytes_received"])
        self._split = self._chooser.next_epoch(
            self._seen[0] - seen[0], self._seen[1] - seen[1], time.monotonic()
        )
        self.inbox.set_split(self._split)

    def start_epoch(self, orders: Callable[[int], list[int]]) -> None:
        """The exchange threads start the epoch: call once its workers exist (see DataLoader.__iter__), with
        ``orders(r)``, the samples rank r walks in it, the same on every rank (the sampler's whole epoch, or
        what each rank has left of a restored one: ``loader.resume.world_change``)."""
        self._say_gone()
        self.exchange.start_epoch(orders, self._split)

    def serve_from(self, dataset: Any) -> None:
        """The loader's bound dataset: this node's records are read through it for the other nodes."""
        self._dataset = dataset

    def _read_owned(self, index: int) -> bytes:
        """A record this node owns, for another node: from the cache, or from storage (then admitted)."""
        raw, from_cache = self._dataset.read_record(index)
        if not from_cache:
            with self._lock:
                self.read_to_serve += len(raw)
        return raw

    def _say_gone(self) -> None:
        for peer in sorted(self.exchange.gone - self._said_gone):
            self._said_gone.add(peer)
            warnings.warn(
                f"partition_cache: peer {peer} is gone; its records are read from storage",
                RuntimeWarning,
                stacklevel=4,
            )

    def stats(self) -> dict[str, float]:
        """The exchange's counts for this rank, with the nodes it sees."""
        with self._lock:
            read = self.read_to_serve
        return {
            "nodes": self.layout.nodes,
            "node": self.layout.node,
            **self.exchange.counts,
            "bytes_read_to_serve": read,
            "peers_gone": len(self.exchange.gone),
            "storage_share": self._split.share,
        }
