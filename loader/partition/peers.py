"""The worker's side of a partitioned cache: which records are this node's, and taking the others' records
from the inbox (or from storage: those the epoch's split reads there, and all once their node is gone or
``timeout`` seconds pass)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from loader.partition.inbox import Inbox
from loader.partition.plan import Layout
from loader.partition.split import Split

__all__ = ["PeerRecords"]


@dataclass
class PeerRecords:
    """Picklable: goes to every worker with the dataset."""

    layout: Layout
    inbox: Inbox
    timeout: float
    _warned: bool = False
    _split: tuple[int, Split] = (0, Split())

    def local(self, index: int) -> bool:
        return self.layout.local(index)

    def take(self, index: int) -> bytes | None:
        """Record ``index`` as its node sent it; None: read it from storage, as this epoch's split says (the
        node does not send it), or because the node is gone or late (said once per process)."""
        self._split = self.inbox.split(self._split)
        if self._split[1].from_storage(index):
            return None
        owner = self.layout.owner(index)
        record = self.inbox.take(index, owner, self.timeout)
        if record is None and not self._warned:
            self._warned = True
            why = "is gone" if self.inbox.gone(owner) else f"sent nothing for {self.timeout:g} s"
            warnings.warn(
                f"partition_cache: node {owner} (rank {self.layout.leader(owner)}) {why}; its records are "
                "read from storage",
                RuntimeWarning,
                stacklevel=2,
            )
        return record
