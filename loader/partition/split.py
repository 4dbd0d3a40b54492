"""Which of a rank's records that other nodes cache it reads from storage instead, epoch by epoch.

A record another node caches can come from that node (the exchange) or from storage. Peers save storage
reads, but the exchange has costs of its own (the sender's copies, gloo's thread, the inbox files): on 2 nodes
over loopback with storage at 200 MB/s, peers alone made the epoch 7-15% slower than independent caches
(``bench_partition``). So each rank measures both paths, per epoch: storage, ``S``, the bytes its workers
read from the source over the time they spent reading (``W`` workers read at once), and peers, ``P``, the
bytes its exchange received over the time it spent receiving. Where storage is about as fast as the peers or
faster (``S >= SPLIT_WHEN * P``), a share ``f = S / (S + P)`` of those records is read from storage, so that
both paths end together: the remote part of the epoch takes ``X / (S + P)`` instead of ``X / P``. Where
the peers are clearly faster, every such record comes from them: storage reads are what the partitioned
cache is there to save (egress, a shared filesystem's load).

Which records: those whose index and epoch hash below ``f``; the receiving rank sends ``(epoch, f)`` to the
node that serves it at the start of each epoch's exchange, and both sides leave those records out. The
first two epochs take every record from the peers: the first fills the caches (the serving nodes read
storage themselves), the second measures the peers warm.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SPLIT_WHEN", "Split", "SplitChooser"]

SPLIT_WHEN = 0.8  # storage at least this fraction of the peers' rate: both paths share the records
WARM = 2  # epochs that take every record from the peers: one fills the caches, one measures them warm
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
        self.storage_rate: float | None = None  # bytes/s, this rank's workers together
        self.peer_rate: float | None = None
        self.split = Split(-1, 0.0)

    def next_epoch(self, source: tuple[float, float], received: tuple[float, float], workers: int) -> Split:
        """The split of the next epoch, from the last one's (bytes, seconds) read from the source by its
        ``workers`` and received from the peers."""
        epoch = self.split.epoch + 1
        read, reading = source
        if read > 0 and reading > 0:
            self.storage_rate = read * max(1, workers) / reading
        got, receiving = received
        if epoch >= WARM and got > 0 and receiving > 0:  # the epoch that ended read warm caches
            self.peer_rate = got / receiving
        self.split = Split(epoch, self._share(epoch))
        return self.split

    def _share(self, epoch: int) -> float:
        s, p = self.storage_rate, self.peer_rate
        if epoch < WARM or s is None or p is None or s < SPLIT_WHEN * p:
            return 0.0
        return s / (s + p)
