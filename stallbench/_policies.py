"""Cache policies for ``stallbench simulate``: each maps a read trace to one outcome per read.

A trace holds every read of every epoch in time order: ``records[t]`` is read by node ``readers[t]``. Each
epoch's order is ``rng.permutation(dataset_records)`` from one ``numpy.random.default_rng(seed)``, and node
``k`` takes positions ``k, k + N, ...`` of it, as torch's ``DistributedSampler`` splits an epoch (without
the padding it adds when N does not divide the dataset: at most N - 1 repeated reads per epoch).

Outcomes: ``MISS`` (read from storage), ``LOCAL`` (hit in the reader's own cache), ``REMOTE`` (hit in the
owning peer's cache, fetched over the network) and ``FILL`` (read from storage, then sent over the network
to the owning peer, which caches it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["FILL", "LOCAL", "MISS", "POLICIES", "REMOTE", "Trace", "make_trace"]

MISS, LOCAL, REMOTE, FILL = 0, 1, 2, 3


@dataclass(frozen=True)
class Trace:
    """Every read of a run: ``records[t]`` read by node ``readers[t]``, ``dataset_records`` per epoch."""

    records: np.ndarray
    readers: np.ndarray
    dataset_records: int
    nodes: int


def make_trace(dataset_records: int, epochs: int, nodes: int, seed: int) -> Trace:
    """A fresh random permutation per epoch, split across ``nodes`` like ``DistributedSampler``."""
    rng = np.random.default_rng(seed)
    records = np.concatenate([rng.permutation(dataset_records) for _ in range(epochs)])
    readers = np.tile(np.arange(dataset_records) % nodes, epochs)
    return Trace(records, readers, dataset_records, nodes)


def lru(trace: Trace, capacity: int) -> np.ndarray:
    """Each node its own cache of ``capacity`` records, least recently used evicted (the OS page cache)."""
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(trace.nodes)]
    out = bytearray(len(trace.records))  # zero is MISS
    for t, (record, node) in enumerate(zip(trace.records.tolist(), trace.readers.tolist(), strict=True)):
        cache = caches[node]
        if record in cache:
            cache.move_to_end(record)
            out[t] = LOCAL
        else:
            cache[record] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return np.frombuffer(out, dtype=np.int8)


def _admit_until_full(
    keys: np.ndarray, group_of: Callable[[np.ndarray], np.ndarray], capacity: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per read: (hit, filled). The cache of each group admits its keys in order of first read until full.

    ``group_of`` maps keys to the cache that holds them. ``filled`` marks the first read of a key that gets
    admitted; ``hit`` marks a later read of an admitted key.
    """
    distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    groups = group_of(distinct)
    by_group = np.lexsort((first, groups))
    sorted_groups = groups[by_group]
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[by_group] = np.arange(len(distinct)) - np.searchsorted(sorted_groups, sorted_groups)
    admitted = (rank < capacity)[inverse]
    first_read = first[inverse] == np.arange(len(keys))
    return admitted & ~first_read, admitted & first_read


def minio(trace: Trace, capacity: int) -> np.ndarray:
    """Each node its own cache of ``capacity`` records: admit until full, never evict."""
    keys = trace.readers.astype(np.int64) * trace.dataset_records + trace.records
    hit, _ = _admit_until_full(keys, lambda k: k // trace.dataset_records, capacity)
    return np.where(hit, LOCAL, MISS).astype(np.int8)


def minio_partitioned(trace: Trace, capacity: int) -> np.ndarray:
    """Record ``r`` is cached only by its owner, node ``r % N`` (up to ``capacity`` records each).

    A miss anywhere admits the record at its owner while the owner has room: a reader that is not the
    owner sends it there (``FILL``). A hit is ``LOCAL`` when the reader owns the record, else ``REMOTE``.
    """
    owners = trace.records % trace.nodes
    hit, filled = _admit_until_full(trace.records, lambda k: k % trace.nodes, capacity)
    local = trace.readers == owners
    out = np.full(len(trace.records), MISS, dtype=np.int8)
    out[hit & local] = LOCAL
    out[hit & ~local] = REMOTE
    out[filled & ~local] = FILL
    return out


POLICIES: dict[str, Callable[[Trace, int], np.ndarray]] = {
    "lru": lru,
    "minio": minio,
    "minio-partitioned": minio_partitioned,
}
