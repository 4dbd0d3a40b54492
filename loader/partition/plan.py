"""Who caches which record, and which records each rank will need from each other node, in what order.

Every rank computes both from what it already knows: the nodes (ranks that share one cache: the same host and
cache folder), and every rank's order of the epoch, which the loader works out alike on every rank (a
``DistributedSampler`` draws it from its seed and epoch; in a restored epoch, it is what each rank has left:
``loader.resume.world_change``). Nothing about records is exchanged.

Ownership: record ``i`` belongs to node ``i % nodes``; that node's cache admits it, and that node's first rank
(its leader) serves it to the ranks of other nodes. Records are interleaved, so each node owns an equal share
of any contiguous or shuffled stretch of the dataset, and its cache of C bytes holds min(C, D / nodes) of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loader.partition.split import Split

__all__ = ["CHUNK", "Layout", "chunks_for"]

CHUNK = 32  # records of a rank's order per message: the exchange's step, whatever the batch size


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


def chunks_for(order: list[int], layout: Layout, server_node: int, split: Split) -> list[list[int]]:
    """The records ``server_node`` serves to a rank on another node, in that rank's order, ``CHUNK``
    records of the order at a time (both sides walk the same list; an empty chunk is no message), less those
    the rank's ``split`` reads from storage. The whole order goes, whatever the loader's batch size or
    drop_last: what is left over is cleared."""
    steps = [order[k : k + CHUNK] for k in range(0, len(order), CHUNK)]
    return [
        [i for i in step if layout.owner(i) == server_node and not split.from_storage(i)] for step in steps
    ]
