"""What-if of N nodes: storage bytes per steady epoch with the measured cache on each node.

Two ways to run the cached loader on N nodes, each node with a cache of ``C`` (the measured
``workload.cache_bytes``) and each epoch split across the nodes as torch's ``DistributedSampler`` does:

* partitioned (``partition_cache=True``): node ``k`` caches the records ``i % N == k`` and serves them to the
  others, so the nodes together hold ``N * C`` of the dataset and read ``max(0, D - N * C)`` per epoch;
* independent: each node caches ``C`` of its own, and each epoch reads a fresh ``1/N`` of the dataset on each
  node, of which it holds ``C / D``: ``(1 - C / D) * D`` for all nodes together, whatever ``N``.

As in the rest of the model, the cache holds the records packed (``D`` here is ``record_bytes``) and storage
is counted in device bytes (whole pages): both are ``stallbench.simulate.floor_storage_bytes``, the MinIO
bound, which ``simulate("minio-partitioned")`` and ``simulate("minio")`` reach in their steady epochs. The
torch loader has no partitioned cache, and a cache budget of "the memory available" has no ``C`` to model:
both get no rows.
"""

from __future__ import annotations

from stallbench.analysis.results import NodesPrediction, Workload
from stallbench.jobs.kinds import check_kind
from stallbench.simulate import floor_storage_bytes

__all__ = ["NODE_COUNTS", "nodes_what_if"]

NODE_COUNTS = (1, 2, 4, 8)


def nodes_what_if(workload: Workload, loader: str) -> tuple[NodesPrediction, ...]:
    """For 1, 2, 4 and 8 nodes, the storage bytes per steady epoch with the cache partitioned and with
    independent caches; none for a loader without our cache or a workload without a cache size."""
    if not check_kind(loader).cached or workload.cache_bytes is None:
        return ()
    return tuple(_prediction(workload, nodes) for nodes in NODE_COUNTS)


def _prediction(w: Workload, nodes: int) -> NodesPrediction:
    def floor(together: int) -> int:
        return floor_storage_bytes(w.record_bytes, w.cache_bytes, together, device_bytes=w.dataset_bytes)

    partitioned, independent = floor(nodes), floor(1)  # an independent cache: C/D of what its node reads
    return NodesPrediction(
        nodes=nodes,
        partitioned_storage_bytes=partitioned,
        partitioned_storage_bytes_per_node=round(partitioned / nodes),
        independent_storage_bytes=independent,
        independent_storage_bytes_per_node=round(independent / nodes),
    )
