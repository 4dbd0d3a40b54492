"""What-if of N nodes: storage bytes and time of a steady epoch with the measured cache on each node.

Two ways to run the cached loader on N nodes like the one measured (its cores, its workers, a cache of ``C``,
the measured ``workload.cache_bytes``, each), each epoch split across the nodes as torch's
``DistributedSampler`` does, all of them reading one storage whose bandwidth, measured here, they share (a
network filesystem, an object store's limit for the job: the benchmark's shared throttle):

* partitioned (``partition_cache=True``): node ``k`` caches the records ``i % N == k`` and serves them to the
  others, so the nodes together hold ``N * C`` of the dataset and read ``max(0, D - N * C)`` per epoch; each
  node also takes ``X = D (N - 1) / N^2`` of records from the others through the exchange;
* independent: each node caches ``C`` of its own, and each epoch reads a fresh ``1/N`` of the dataset on each
  node, of which it holds ``C / D``: ``(1 - C / D) * D`` for all nodes together, whatever ``N``.

As in the rest of the model, the cache holds the records packed (``D`` here is ``record_bytes``) and storage
is counted in device bytes (whole pages): both are ``stallbench.simulate.floor_storage_bytes``, the MinIO
bound, which ``simulate("minio-partitioned")`` and ``simulate("minio")`` reach in their steady epochs.

The epoch on each node has the three terms of ``stallbench.analysis.whatif``, for its ``1/N`` of the samples:
compute ``T1 / N``, prep ``prep(workers) / N``, the node's CPU (the measured epoch's CPU, all of the job's
processes, storage reads and batches handed over included, ``/ N``, over its cores: on a node whose cores
are busy every other term hides behind it), and fetch, all nodes' storage bytes over the shared
bandwidth (the share of them the measured run read from storage: the page cache serves the rest, as in
``whatif``'s miss fraction). Partitioned, a node also spends the exchange's CPU on the ``X`` bytes it takes
from its peers (and as many it sends them), measured per byte on this machine
(``stallbench.analysis.exchange_cost``): added to prep and to the CPU term. The network between the nodes
is not modelled: over loopback the exchange is bound by that CPU, and a slower link would make the
partitioned epoch longer. Where storage is about as fast as the peers the loader reads a share of the
remote records from storage (``loader.partition.split``); the what-if applies the loader's rule to the rates
the loader would measure: a node's storage bytes over its first epoch (the measured run's first, which
read everything from storage, scaled to N nodes by the model), and ``X`` over an epoch that takes it all
from the peers; a split predicted slower than the peers alone is dropped, as the loader drops one it
measures slower. Each epoch is calibrated on the measured one as every prediction is, ``T2 * model(N) /
model(1)``, and never faster than ``T1 / N``. The torch loader has no partitioned cache, and a cache budget
of "the memory available" has no ``C`` to model: both get no rows.
"""

from __future__ import annotations

import warnings

from stallbench.analysis.exchange_cost import exchange_cost
from stallbench.analysis.prep_term import prep_seconds
from stallbench.analysis.results import NodesPrediction
from stallbench.analysis.whatif import Measured
from stallbench.jobs.kinds import check_kind
from stallbench.simulate import floor_storage_bytes

__all__ = ["NODE_COUNTS", "nodes_what_if"]

NODE_COUNTS = (1, 2, 4, 8)


def nodes_what_if(m: Measured, exchange_cpu: float | None = None) -> tuple[NodesPrediction, ...]:
    """For 1, 2, 4 and 8 nodes, storage bytes and seconds of a steady epoch with the cache partitioned and
    with independent caches; none for a loader without our cache or a workload without a cache size.
    ``exchange_cpu``: CPU seconds per byte a node takes from its peers, measured here (``exchange_cost``,
    at the workload's record size) when not given."""
    w = m.workload
    if not check_kind(m.loader).cached or w.cache_bytes is None:
        return ()
    if exchange_cpu is None:
        try:
            exchange_cpu = exchange_cost().per_byte(max(1, w.record_bytes // w.samples))
        except RuntimeError as e:
            warnings.warn(f"the nodes what-if is left out: {e}", RuntimeWarning, stacklevel=2)
            return ()
    nodes = _Nodes(m, exchange_cpu)
    return tuple(nodes.prediction(n) for n in NODE_COUNTS)


class _Nodes:
    """The model of one measured run on N nodes."""

    def __init__(self, m: Measured, exchange_cpu: float) -> None:
        self.m, self.exchange_cpu = m, exchange_cpu
        b = m.breakdown  # a steady epoch's CPU, all of it: measured, or the steps' and prep's
        self.cpu = m.cpu_seconds if m.cpu_seconds is not None else b.step_cpu_seconds + b.prep_cpu_seconds
        floor, measured = self._floor(1), m.storage_bytes
        self.read = 1.0 if measured is None or not floor else min(1.0, measured / floor)
        self.base = self._model(1, floor, 0.0, read=self.read)

    def prediction(self, nodes: int) -> NodesPrediction:
        w = self.m.workload
        independent = self._floor(1)  # an independent cache: C/D of what its node reads
        storage, exchanged = self._floor(nodes), w.record_bytes * (nodes - 1) / nodes**2
        alone = seconds = self._seconds(nodes, storage, exchanged)
        share = self._share(nodes, exchanged, alone)
        if share:
            held = min(1.0, nodes * w.cache_bytes / w.record_bytes)  # the remote records a peer would send
            split = storage + round(share * held * w.dataset_bytes * (nodes - 1) / nodes)
            with_split = self._seconds(nodes, split, exchanged * (1 - share))
            if with_split <= alone:
                storage, seconds = split, with_split
            else:
                share = 0.0
        return NodesPrediction(
            nodes=nodes,
            partitioned_storage_bytes=storage,
            partitioned_storage_bytes_per_node=round(storage / nodes),
            independent_storage_bytes=independent,
            independent_storage_bytes_per_node=round(independent / nodes),
            partitioned_epoch_seconds=seconds,
            independent_epoch_seconds=self._seconds(nodes, independent, 0.0),
            storage_share=share,
            peers_only_epoch_seconds=alone,
        )

    def _floor(self, nodes: int) -> int:
        w = self.m.workload
        return floor_storage_bytes(w.record_bytes, w.cache_bytes, nodes, device_bytes=w.dataset_bytes)

    def _share(self, nodes: int, exchanged: float, alone: float) -> float:
        """The loader's split of remote records, from the rates it would measure: storage's over the first
        epoch (every record read from storage: the measured run's first epoch, scaled to N nodes) and the
        peers' over an epoch that takes them all from the peers."""
        from loader.instrument import split_share  # here: the command line starts without loader

        if not exchanged:
            return 0.0
        w, b = self.m.workload, self.m.breakdown
        everything = w.dataset_bytes
        first = (b.warmup_seconds + b.epoch_seconds) * self._model(nodes, everything, 0.0, read=1.0)
        first /= self._model(1, everything, 0.0, read=1.0)
        return split_share(everything / nodes / first, exchanged / alone)

    def _seconds(self, nodes: int, storage_bytes: float, exchanged: float) -> float:
        """A node's steady epoch, calibrated on the measured one; ``storage_bytes``: all nodes',
        ``exchanged``: the bytes a node takes from its peers."""
        b = self.m.breakdown
        model = self._model(nodes, storage_bytes, exchanged, read=self.read)
        return max(b.step_alone_seconds / nodes, b.epoch_seconds * model / self.base)

    def _model(self, nodes: int, storage_bytes: float, exchanged: float, *, read: float) -> float:
        """The largest term; ``read``: the share of ``storage_bytes`` storage gives (the rest is cached)."""
        m, exchange = self.m, exchanged * self.exchange_cpu
        terms = (
            m.breakdown.step_alone_seconds / nodes,
            prep_seconds(m, m.workload.workers) / nodes + exchange / m.machine.cores,
            (self.cpu / nodes + exchange) / m.machine.cores,
            read * storage_bytes / m.machine.storage_bytes_per_s,
        )
        return max(terms)
