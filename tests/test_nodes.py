"""stallbench.analysis.nodes: the nodes what-if against its formulas, the simulation and the measured runs.

The epochs are checked against the model written out by hand on a measured run like bench_partition's one
emulated node; the benchmark itself checks them against two nodes measured (``bench_partition.py``)."""

from __future__ import annotations

import pytest

from stallbench.analysis import nodes as nodes_module
from stallbench.analysis.nodes import NODE_COUNTS, nodes_what_if
from stallbench.analysis.results import Breakdown, Machine, NodesPrediction, Workload
from stallbench.analysis.whatif import Measured
from stallbench.simulate import simulate

# benchmarks/bench_partition.py: 3,000 records of 112 KiB (whole pages: device bytes = record bytes), 344 MB
RECORDS, RECORD_BYTES = 3000, 114_688
D = RECORDS * RECORD_BYTES
CHEAP = 0.0  # an exchange that costs no CPU: the peers are always the faster path, no split


def measured(
    cache_bytes: int | None,
    *,
    loader: str = "cached",
    dataset_bytes: int = D,
    record_bytes: int = D,
    storage: float = 100e6,
    t1: float = 0.0,
    t2: float = 1.8,
    first: float = 3.6,
    cpu: float | None = 1.0,
    cores: int = 2,
    storage_bytes: int | None = None,
) -> Measured:
    """A run of bench_partition's job on one node: 3,000 raw records, prep next to nothing (a million
    samples per core-second), ``first``: its first epoch's seconds, ``cpu``: a steady epoch's CPU."""
    workload = Workload(
        data="/data", dataset_bytes=dataset_bytes, record_bytes=record_bytes, samples=RECORDS, batch_size=32,
        workers=2, compute="emulated:0", epochs=4, cache_bytes=cache_bytes, storage_bandwidth=None,
        memory_limit=None,
    )  # fmt: skip
    breakdown = Breakdown(
        epoch_seconds=t2, compute_seconds=t1, prep_stall_seconds=0.0, fetch_stall_seconds=t2 - t1,
        warmup_seconds=first - t2, step_alone_seconds=t1, warm_epoch_seconds=max(t1, 0.01),
    )  # fmt: skip
    machine = Machine(cores, storage, 10e9, 1e6)
    return Measured(workload, breakdown, machine, loader, storage_bytes, cpu)


def at(cache_bytes: int, nodes: int, exchange_cpu: float = CHEAP, **run) -> NodesPrediction:
    rows = nodes_what_if(measured(cache_bytes, **run), exchange_cpu)
    return next(p for p in rows if p.nodes == nodes)


def steady_storage(policy: str, cache_bytes: int, nodes: int) -> list[int]:
    """Storage bytes of every epoch after the first, all nodes together, simulated on the bench's records."""
    result = simulate(policy, dataset_bytes=D, cache_bytes=cache_bytes, record_bytes=RECORD_BYTES, epochs=4,
                      nodes=nodes)  # fmt: skip
    return [e.storage_bytes for e in result.epochs[1:]]


def test_one_row_per_node_count_with_the_formulas():
    rows = nodes_what_if(measured(D // 4), CHEAP)
    assert [p.nodes for p in rows] == list(NODE_COUNTS) == [1, 2, 4, 8]
    for p in rows:
        assert p.partitioned_storage_bytes == max(0, D - p.nodes * (D // 4))
        assert p.independent_storage_bytes == D - D // 4  # (1 - C/D) * D, whatever N
        assert p.partitioned_storage_bytes_per_node == round(p.partitioned_storage_bytes / p.nodes)
        assert p.independent_storage_bytes_per_node == round(p.independent_storage_bytes / p.nodes)
        assert p.storage_share == 0.0


def test_the_cache_holds_records_and_storage_counts_device_bytes():
    # 6,000-byte records cost the device 8,192 each: C / record bytes is the share held, of the device bytes
    m = measured(3_000_000, dataset_bytes=8_192_000, record_bytes=6_000_000, first=100.0)  # no split
    one, two = nodes_what_if(m, CHEAP)[:2]
    assert one.partitioned_storage_bytes == one.independent_storage_bytes == 4_096_000
    assert two.partitioned_storage_bytes == 0 and two.independent_storage_bytes == 4_096_000


def test_no_rows_for_torch_or_without_a_cache_size():
    assert nodes_what_if(measured(D // 2, loader="torch"), CHEAP) == ()  # the page cache is not partitioned
    assert nodes_what_if(measured(None), CHEAP) == ()  # "the memory available": no C to model
    with pytest.raises(ValueError, match="unknown loader 'other'"):
        measured(D // 2, loader="other")


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


def test_one_node_is_the_measured_epoch():
    one = at(D // 2, 1, exchange_cpu=4e-9)
    assert (
        one.partitioned_epoch_seconds == one.independent_epoch_seconds == one.peers_only_epoch_seconds == 1.8
    )


def test_shared_storage_bounds_independent_nodes_and_the_peers_lift_it():
    # storage-bound at 100 MB/s: D/2 = 172 MB a steady epoch, 1.72 s, measured 1.8 s. Independent nodes still
    # read D/2 together from the one storage; partitioned, a node's CPU binds: its 1/N of the measured 1 s,
    # and 4 ns a byte for the X = D (N - 1) / N^2 it takes from its peers, on 2 cores
    e = 4e-9
    for n in (2, 4, 8):
        p = at(D // 2, n, exchange_cpu=e)
        assert p.independent_epoch_seconds == pytest.approx(1.8)
        cpu = (1.0 / n + D * (n - 1) / n**2 * e) / 2
        assert p.partitioned_epoch_seconds == pytest.approx(1.8 * cpu / (D / 2 / 100e6))
        assert p.storage_share == 0.0  # 172 MB over a 3.6 s first epoch: storage far slower than the peers


def test_an_exchange_dearer_than_storage_is_shared_with_it():
    # storage at 2 GB/s, a CPU-bound node (1.8 s of CPU on 1 core, its first epoch 2 s): a costly exchange
    # (40 ns a byte) makes the peers alone slower than independent caches, so the loader's rule reads most
    # remote records from storage instead, which cuts the epoch
    run = dict(storage=2e9, cores=1, cpu=1.8, first=2.0, exchange_cpu=40e-9)
    p = at(D // 2, 2, **run)
    assert p.peers_only_epoch_seconds > p.independent_epoch_seconds
    assert 0.5 < p.storage_share < 1.0
    assert p.partitioned_epoch_seconds < p.peers_only_epoch_seconds
    # every remote record is cached at its owner (2 C = D): the share read from storage is all extra reads
    assert p.partitioned_storage_bytes == round(p.storage_share * D / 2)


def test_a_split_predicted_slower_than_the_peers_alone_is_dropped():
    # a first epoch of 0.5 s says storage is fast (344 MB/s a node), but steady reads at 100 MB/s would make
    # the split's extra reads the bound: the loader measures that and drops it, and so does the what-if
    p = at(D // 2, 2, exchange_cpu=8e-9, first=0.5)
    assert p.storage_share == 0.0
    assert p.partitioned_epoch_seconds == p.peers_only_epoch_seconds
    assert p.partitioned_storage_bytes == 0


def test_what_the_page_cache_served_is_not_read_again():
    # the measured run read no storage after its first epoch (the page cache held its misses): the storage
    # term is empty at any N, and independent nodes are bound by their CPU, 1 s / N on 2 cores
    p = at(D // 2, 2, storage_bytes=0)
    assert p.independent_epoch_seconds == pytest.approx(1.8 * (1.0 / 2 / 2) / (1.0 / 2))


def test_no_node_is_faster_than_its_share_of_the_steps():
    for n in NODE_COUNTS:  # the steps alone take the whole measured epoch: compute-bound
        p = at(D // 2, n, t1=1.8, cpu=0.1, storage=10e9)
        assert p.partitioned_epoch_seconds == p.independent_epoch_seconds == pytest.approx(1.8 / n)


def test_a_failed_exchange_probe_leaves_the_rows_out_with_a_warning(monkeypatch):
    def fails() -> float:
        raise RuntimeError("the exchange probe exited with 1: no gloo")

    monkeypatch.setattr(nodes_module, "exchange_cost", fails)
    with pytest.warns(
        RuntimeWarning, match="the nodes what-if is left out: the exchange probe exited with 1"
    ):
        assert nodes_what_if(measured(D // 2)) == ()
