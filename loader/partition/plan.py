"""Who caches which record, and which records each rank will need from each other node, in what order.

Every rank computes both from what it already knows: the nodes (ranks that share one cache: the same host and
cache folder), and the epoch's order of every rank, which a ``DistributedSampler`` draws the same way on every
rank from its seed and epoch. Nothing about records is exchanged.

Ownership: record ``i`` belongs to node ``i % nodes``; that node's cache admits it, and that node's first rank
(its leader) serves it to the ranks of other nodes. Records are interleaved, so each node owns an equal share
of any contiguous or shuffled stretch of the dataset, and its cache of C bytes holds min(C, D / nodes) of it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from torch.utils.data import DistributedSampler

__all__ = ["Layout", "batches_of", "chunks_for"]


@dataclass(frozen=True)
class Layout:
    """The ranks' nodes: ``node_of[r]`` is rank r's node; nodes are numbered by their lowest rank."""

    node_of: tuple[int, ...]
    rank: int

    @classmethod
    def from_places(cls, places: Sequence[object], rank: int) -> Layout:
        """Ranks at the same place (host and cache folder) form one node, in order of their first rank."""
        first: dict[object, int] = {}
        return cls(tuple(first.setdefault(p, len(first)) for p in places), rank)

    @property
    def nodes(self) -> int:
        return max(self.node_of) + 1

    @property
    def node(self) -> int:
        return self.node_of[self.rank]

    def owner(self, index: int) -> int:
        """The node whose cache holds record ``index``."""
        return index % self.nodes

    def leader(self, node: int) -> int:
        """The rank that serves ``node``'s records to other nodes."""
        return self.node_of.index(node)

    def local(self, index: int) -> bool:
        """Whether record ``index`` belongs to this rank's own node (read from the local cache or storage)."""
        return self.owner(index) == self.node

    @property
    def leads(self) -> bool:
        return self.leader(self.node) == self.rank


def batches_of(sampler: DistributedSampler, rank: int, batch_size: int, drop_last: bool) -> list[list[int]]:
    """Rank ``rank``'s batches of the sampler's current epoch, as that rank's loader will draw them."""
    theirs = copy.copy(sampler)
    theirs.rank = rank
    order = list(theirs)
    cut = len(order) - len(order) % batch_size if drop_last else len(order)
    return [order[k : k + batch_size] for k in range(0, cut, batch_size)]


def chunks_for(batches: list[list[int]], layout: Layout, server_node: int) -> list[list[int]]:
    """The records of each batch that ``server_node`` serves to a rank on another node (empty lists kept:
    both sides walk the same list, one message per non-empty chunk)."""
    return [[i for i in batch if layout.owner(i) == server_node] for batch in batches]
