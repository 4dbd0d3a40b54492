"""Which of a rank's records that other nodes cache it reads from storage instead, epoch by epoch.

A record another node caches can come from that node (the exchange) or from storage. Peers save storage
reads, but the exchange has costs of its own (the sender's copies, gloo's thread, the inbox files, the CPU
all of it takes from the workers): on 2 nodes over loopback with storage at 200 MB/s, peers alone made the
epoch 5-15% slower than independent caches (``bench_partition``). So each rank measures what each path gives
it over a whole epoch, everything it costs included: storage, ``S``, the bytes its node read from storage in
the first epoch (its workers' and, on the node's leader, those read to serve other nodes) over that epoch's
time; the peers, ``P``, the bytes the second epoch (caches warm, every record from the peers) received over
its time. Where storage is about as fast as the peers or faster (``S >= SPLIT_WHEN * P``), a share ``f = S /
(S + P)`` of those records is read from storage from the third epoch on, so that both paths end together.
Where the peers are clearly faster, every such record comes from them: storage reads are what the
partitioned cache is there to save (egress, a shared filesystem's load). An epoch with a split measured
slower than the peers' alone (by more than ``NOISE``) drops the split for good.

Which records: those whose index and epoch hash below ``f``; the receiving rank sends ``(epoch, f)`` to the
node that serves it at the start of each epoch's exchange, and both sides leave those records out.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SPLIT_WHEN", "Split", "SplitChooser", "split_share"]

SPLIT_WHEN = 0.8  # storage at least this fraction of the peers' rate: both paths share the records
NOISE = 0.15  # a split epoch this much slower than the peers' alone drops it (a job's epochs vary 10%)
_MIX = 0x9E3779B1  # Knuth's multiplicative hash: consecutive indices spread over the 32-bit range
_EPOCH_MIX = 0x85EBCA77


@dataclass(frozen=True)
class Split:
    """An epoch's ``share`` of remote records read from storage."""

    epoch: int = 0
    share: float = 0.0

    def from_storage(self, index: int) -> bool:
        """Whether record ``index`` is read from storage this epoch (the same answer on every rank)."""
        if self.share <= 0.0:
            return False
        mixed = ((index * _MIX) ^ (self.epoch * _EPOCH_MIX)) & 0xFFFFFFFF
        return mixed < self.share * (1 << 32)


class SplitChooser:
    """A rank's measured rates and the split they give for its next epoch."""

    def __init__(self) -> None:
        self.storage_rate: float | None = None  # bytes/s over the first epoch, all it cost included
        self.peer_rate: float | None = None  # bytes/s over the second
        self.split = Split(-1, 0.0)
        self._peers_alone: float | None = None  # the second epoch's seconds
        self._dropped = False
        self._started: float | None = None

    def next_epoch(self, from_storage: float, received: float, now: float) -> Split:
        """The split of the next epoch, from the bytes the last one read from storage for this node and
        received from the peers; ``now``: a monotonic clock, read where each epoch starts."""
        ended, seconds = self.split, now - self._started if self._started is not None else 0.0
        self._started = now
        if seconds > 0 and ended.epoch == 0:
            self.storage_rate = from_storage / seconds
        elif seconds > 0 and ended.epoch == 1:
            self.peer_rate, self._peers_alone = received / seconds, seconds
        elif ended.share > 0 and self._peers_alone is not None and seconds > (1 + NOISE) * self._peers_alone:
            self._dropped = True  # measured slower than the peers alone
        self.split = Split(ended.epoch + 1, self._share(ended.epoch + 1))
        return self.split

    def _share(self, epoch: int) -> float:
        s, p = self.storage_rate, self.peer_rate
        return 0.0 if epoch < 2 or self._dropped or not s or not p else split_share(s, p)


def split_share(storage_rate: float, peer_rate: float) -> float:
    """The share of remote records read from storage, from the two paths' rates (bytes/s, both positive):
    ``S / (S + P)`` where storage is about as fast as the peers or faster, else none."""
    if storage_rate < SPLIT_WHEN * peer_rate:
        return 0.0
    return storage_rate / (storage_rate + peer_rate)
