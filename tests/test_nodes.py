"""stallbench.analysis.nodes: the nodes what-if against its formulas, the simulation and the measured runs."""

from __future__ import annotations

import pytest

from stallbench.analysis.nodes import NODE_COUNTS, nodes_what_if
from stallbench.analysis.results import NodesPrediction, Workload
from stallbench.simulate import simulate

# benchmarks/bench_partition.py: 3,000 records of 112 KiB (whole pages: device bytes = record bytes), 344 MB
RECORDS, RECORD_BYTES = 3000, 114_688
D = RECORDS * RECORD_BYTES


def workload(cache_bytes: int | None, *, dataset_bytes: int = D, record_bytes: int = D) -> Workload:
    return Workload(
        data="/data", dataset_bytes=dataset_bytes, record_bytes=record_bytes, samples=RECORDS, batch_size=32,
        workers=2, compute="emulated:10", epochs=4, cache_bytes=cache_bytes, storage_bandwidth=None,
        memory_limit=None,
    )  # fmt: skip


def at(cache_bytes: int, nodes: int) -> NodesPrediction:
    return next(p for p in nodes_what_if(workload(cache_bytes), "cached") if p.nodes == nodes)


def steady_storage(policy: str, cache_bytes: int, nodes: int) -> list[int]:
    """Storage bytes of every epoch after the first, all nodes together, simulated on the bench's records."""
    result = simulate(policy, dataset_bytes=D, cache_bytes=cache_bytes, record_bytes=RECORD_BYTES, epochs=4,
                      nodes=nodes)  # fmt: skip
    return [e.storage_bytes for e in result.epochs[1:]]


def test_one_row_per_node_count_with_the_formulas():
    rows = nodes_what_if(workload(D // 4), "cached")
    assert [p.nodes for p in rows] == list(NODE_COUNTS) == [1, 2, 4, 8]
    for p in rows:
        assert p.partitioned_storage_bytes == max(0, D - p.nodes * (D // 4))
        assert p.independent_storage_bytes == D - D // 4  # (1 - C/D) * D, whatever N
        assert p.partitioned_storage_bytes_per_node == round(p.partitioned_storage_bytes / p.nodes)
        assert p.independent_storage_bytes_per_node == round(p.independent_storage_bytes / p.nodes)


def test_the_cache_holds_records_and_storage_counts_device_bytes():
    # 6,000-byte records cost the device 8,192 each: C / record bytes is the share held, of the device bytes
    w = workload(3_000_000, dataset_bytes=8_192_000, record_bytes=6_000_000)
    one, two = nodes_what_if(w, "cached")[:2]
    assert one.partitioned_storage_bytes == one.independent_storage_bytes == 4_096_000
    assert two.partitioned_storage_bytes == 0 and two.independent_storage_bytes == 4_096_000


def test_no_rows_for_torch_or_without_a_cache_size():
    assert nodes_what_if(workload(D // 2), "torch") == ()  # the page cache is not partitioned
    assert nodes_what_if(workload(None), "cached") == ()  # "the memory available": no C to model
    with pytest.raises(ValueError, match="unknown loader 'other'"):
        nodes_what_if(workload(D // 2), "other")


@pytest.mark.parametrize(("nodes", "share", "partitioned"), [(2, 0.5, 0.0), (2, 0.25, 0.5), (4, 0.25, 0.0)])
def test_partitioned_what_if_matches_the_simulation(nodes: int, share: float, partitioned: float):
    cache = round(share * D)
    predicted = at(cache, nodes).partitioned_storage_bytes
    assert predicted == pytest.approx(partitioned * D, abs=0.02 * D)
    for simulated in steady_storage("minio-partitioned", cache, nodes):
        assert simulated == pytest.approx(predicted, abs=0.02 * D)


@pytest.mark.parametrize(("nodes", "share"), [(2, 0.5), (2, 0.25), (4, 0.25)])
def test_independent_what_if_matches_the_simulation(nodes: int, share: float):
    cache = round(share * D)
    predicted = at(cache, nodes).independent_storage_bytes
    assert predicted == pytest.approx((1 - share) * D, abs=0.001 * D)
    for simulated in steady_storage("minio", cache, nodes):
        assert simulated == pytest.approx(predicted, abs=0.02 * D)


# What bench_partition.py measured (docs/stallbench.md, the what-if): 2 emulated nodes, a cache of D/2 each,
# 344 MB; storage per epoch after the first, as shares of D (lowest, highest).
MEASURED = {"partitioned": (0.0, 0.0), "independent": (0.503, 0.529)}


def test_what_if_agrees_with_the_measured_two_node_runs():
    two = at(D // 2, 2)
    model = {
        "partitioned": two.partitioned_storage_bytes / D,
        "independent": two.independent_storage_bytes / D,
    }
    assert model == pytest.approx({"partitioned": 0.0, "independent": 0.5})
    for caches, (low, high) in MEASURED.items():
        assert low - 0.03 <= model[caches] <= high + 0.03, (caches, model[caches], low, high)
