"""stallbench.simulate against exact figures and plain reference implementations of each policy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stallbench.conditions.storage import PAGE
from stallbench.simulate import (
    POLICIES,
    SimulationResult,
    floor_storage_bytes,
    format_simulation,
    simulate,
    simulate_all,
    simulation_to_json,
)

RB = PAGE  # record bytes in most tests (whole pages: device bytes = record bytes); sizes are records * RB


def _reads(records: int, epochs: int, nodes: int, seed: int) -> list[list[tuple[int, int]]]:
    """Per epoch, (reader node, record) in time order: the documented order and DistributedSampler split."""
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(records).tolist() for _ in range(epochs)]
    return [[(pos % nodes, record) for pos, record in enumerate(perm)] for perm in perms]


def _lru_reference(records: int, cache: int, epochs: int, nodes: int, seed: int) -> list[int]:
    """Hits per epoch from Mattson's LRU stack, one per node: a hit iff the record's depth is < cache."""
    stacks: list[list[int]] = [[] for _ in range(nodes)]
    hits = []
    for epoch in _reads(records, epochs, nodes, seed):
        hits.append(0)
        for node, record in epoch:
            stack = stacks[node]
            if record in stack:
                hits[-1] += stack.index(record) < cache
                stack.remove(record)
            stack.insert(0, record)
    return hits


def _minio_reference(records: int, cache: int, epochs: int, nodes: int, seed: int) -> list[int]:
    """Hits per epoch with a set per node that admits records until it holds ``cache`` of them."""
    cached: list[set[int]] = [set() for _ in range(nodes)]
    hits = []
    for epoch in _reads(records, epochs, nodes, seed):
        hits.append(0)
        for node, record in epoch:
            if record in cached[node]:
                hits[-1] += 1
            elif len(cached[node]) < cache:
                cached[node].add(record)
    return hits


def _partitioned_reference(records: int, cache: int, epochs: int, nodes: int, seed: int) -> list[tuple]:
    """Per epoch (local hits, remote hits, storage reads, network transfers), one read at a time."""
    cached: list[set[int]] = [set() for _ in range(nodes)]
    out = []
    for epoch in _reads(records, epochs, nodes, seed):
        local = remote = storage = network = 0
        for node, record in epoch:
            owner = record % nodes
            if record in cached[owner]:
                local, remote = (local + 1, remote) if node == owner else (local, remote + 1)
                network += node != owner
                continue
            storage += 1
            if len(cached[owner]) < cache:
                cached[owner].add(record)
                network += node != owner
        out.append((local, remote, storage, network))
    return out


@pytest.mark.parametrize(("records", "cache"), [(1000, 0), (1000, 1), (1000, 250), (1000, 999), (1000, 1500)])
def test_minio_is_exact(records: int, cache: int) -> None:
    result = simulate("minio", dataset_bytes=records * RB, cache_bytes=cache * RB, record_bytes=RB, epochs=4)
    first, *later = result.epochs
    assert (first.hit_rate, first.storage_bytes) == (0.0, records * RB)
    for epoch in later:
        assert epoch.hit_rate == min(cache, records) / records
        assert epoch.storage_bytes == (records - min(cache, records)) * RB
        assert epoch.storage_bytes == floor_storage_bytes(records * RB, cache * RB)
        assert (epoch.remote_hit_rate, epoch.network_bytes) == (0.0, 0)


@pytest.mark.parametrize(("nodes", "cache"), [(2, 100), (3, 200), (4, 600)])
def test_minio_per_node_matches_reference(nodes: int, cache: int) -> None:
    """Without partitioning each node keeps its own cache, still filling after epoch 1 when it has room."""
    records = 1000
    result = simulate(
        "minio", dataset_bytes=records * RB, cache_bytes=cache * RB, record_bytes=RB, epochs=4, nodes=nodes,
        seed=5,
    )  # fmt: skip
    expected = _minio_reference(records, cache, 4, nodes, seed=5)
    assert [e.hit_rate for e in result.epochs] == [h / records for h in expected]
    assert [e.storage_bytes for e in result.epochs] == [(records - h) * RB for h in expected]


@pytest.mark.parametrize("cache", [0, 1, 300, 1000, 1999, 2000, 5000])
@pytest.mark.parametrize(("nodes", "seed"), [(1, 0), (1, 7), (3, 1)])
def test_lru_matches_reference(cache: int, nodes: int, seed: int) -> None:
    records, epochs = 2000, 3
    result = simulate(
        "lru", dataset_bytes=records * RB, cache_bytes=cache * RB, record_bytes=RB, epochs=epochs,
        nodes=nodes, seed=seed,
    )  # fmt: skip
    expected = _lru_reference(records, cache, epochs, nodes, seed)
    assert [e.hit_rate for e in result.epochs] == [h / records for h in expected]
    assert [e.storage_bytes for e in result.epochs] == [(records - h) * RB for h in expected]


@pytest.mark.parametrize(("ratio", "expected"), [(0.25, 0.035), (0.5, 0.155), (0.65, 0.283), (0.8, 0.478)])
def test_lru_matches_design_table(ratio: float, expected: float) -> None:
    records = 100_000
    result = simulate(
        "lru", dataset_bytes=records * RB, cache_bytes=int(ratio * records) * RB, record_bytes=RB
    )
    assert result.epochs[0].hit_rate == 0.0
    for epoch in result.epochs[1:]:
        assert epoch.hit_rate == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize(("records", "nodes", "cache"), [(1000, 2, 100), (1000, 3, 200), (999, 4, 300)])
def test_partitioned_matches_reference(records: int, nodes: int, cache: int) -> None:
    result = simulate(
        "minio-partitioned", dataset_bytes=records * RB, cache_bytes=cache * RB, record_bytes=RB, epochs=3,
        nodes=nodes, seed=3,
    )  # fmt: skip
    got = [
        (round(e.local_hit_rate * records), round(e.remote_hit_rate * records), e.storage_bytes // RB,
         e.network_bytes // RB)
        for e in result.epochs
    ]  # fmt: skip
    assert got == _partitioned_reference(records, cache, 3, nodes, seed=3)


@pytest.mark.parametrize(("nodes", "cache"), [(2, 1000), (4, 1000), (4, 3000), (4, 5000), (3, 4000)])
def test_partitioned_reaches_the_aggregate_floor(nodes: int, cache: int) -> None:
    records = 12_000  # every node count here divides it: each node owns records / nodes
    sizes = dict(dataset_bytes=records * RB, cache_bytes=cache * RB, record_bytes=RB, nodes=nodes)
    result = simulate("minio-partitioned", **sizes)
    assert result.epochs[0].hit_rate == 0.0
    for epoch in result.epochs[1:]:
        assert epoch.hit_rate == min(1, nodes * cache / records)
        assert epoch.local_hit_rate + epoch.remote_hit_rate == pytest.approx(epoch.hit_rate, abs=1e-12)
        assert epoch.storage_bytes == floor_storage_bytes(records * RB, cache * RB, nodes)
        assert epoch.network_bytes == round(epoch.remote_hit_rate * records) * RB


def test_partitioned_local_share_is_one_node_in_n() -> None:
    """A record lands on its owner with probability 1/N, so local ~ C/D and remote ~ (N-1)C/D (N*C <= D)."""
    records, nodes, cache = 100_000, 4, 10_000
    sizes = dict(dataset_bytes=records * RB, cache_bytes=cache * RB, record_bytes=RB, nodes=nodes)
    result = simulate("minio-partitioned", **sizes)
    for epoch in result.epochs[1:]:  # binomial s.d. of either rate here: ~0.0009
        assert epoch.local_hit_rate == pytest.approx(cache / records, abs=0.005)
        assert epoch.remote_hit_rate == pytest.approx((nodes - 1) * cache / records, abs=0.005)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_large_dataset_is_scaled_down(policy: str) -> None:
    """10M records run as the default max_records (200,000) at the same cache/dataset ratio."""
    big = simulate(policy, dataset_bytes=10**7 * RB, cache_bytes=5 * 10**6 * RB, record_bytes=RB, nodes=2)
    small = simulate(policy, dataset_bytes=200_000 * RB, cache_bytes=100_000 * RB, record_bytes=RB, nodes=2)
    assert (big.records, big.cache_records, big.simulated_records, big.scale) == (
        10**7,
        5 * 10**6,
        200_000,
        50,
    )
    assert [e.hit_rate for e in big.epochs] == [e.hit_rate for e in small.epochs]
    assert [e.storage_bytes for e in big.epochs] == [50 * e.storage_bytes for e in small.epochs]
    assert [e.network_bytes for e in big.epochs] == [50 * e.network_bytes for e in small.epochs]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_cache_larger_than_dataset_hits_every_read(policy: str) -> None:
    nodes = 2 if policy == "minio-partitioned" else 1
    result = simulate(policy, dataset_bytes=500 * RB, cache_bytes=800 * RB, record_bytes=RB, nodes=nodes)
    assert [e.hit_rate for e in result.epochs] == [0.0, 1.0, 1.0]
    assert [e.storage_bytes for e in result.epochs] == [500 * RB, 0, 0]


def test_seed_fixes_the_order() -> None:
    sizes = dict(dataset_bytes=5000 * RB, cache_bytes=2500 * RB, record_bytes=RB)
    assert simulate("lru", **sizes, seed=1) == simulate("lru", **sizes, seed=1)
    assert simulate("lru", **sizes, seed=1) != simulate("lru", **sizes, seed=2)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(dataset_bytes=0), "dataset_bytes"),
        (dict(cache_bytes=-1), "cache_bytes"),
        (dict(record_bytes=0), "record_bytes"),
        (dict(record_bytes=10**7), "record_bytes"),
        (dict(epochs=0), "epochs"),
        (dict(epochs=True), "epochs"),
        (dict(nodes=0), "nodes"),
        (dict(nodes=1.5), "nodes"),
        (dict(seed=-1), "seed"),
        (dict(max_records=0), "max_records"),
    ],
)
def test_invalid_arguments_are_named(kwargs: dict, name: str) -> None:
    sizes = dict(dataset_bytes=10**6, cache_bytes=10**5, record_bytes=RB) | kwargs
    with pytest.raises(ValueError, match=f"^{name} must"):
        simulate("lru", **sizes)
    with pytest.raises(ValueError, match=f"^{name} must"):
        simulate_all(**sizes)


def test_unknown_policy_lists_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'fifo'.*lru, minio, minio-partitioned"):
        simulate("fifo", dataset_bytes=10**6, cache_bytes=10**5)


def test_floor_storage_bytes() -> None:
    assert floor_storage_bytes(1000, 250) == 750
    assert floor_storage_bytes(1000, 250, nodes=3) == 250
    assert floor_storage_bytes(1000, 400, nodes=3) == 0
    assert floor_storage_bytes(6000, 3000, device_bytes=8192) == 4096  # half the records, in whole pages
    with pytest.raises(ValueError, match=r"^nodes must"):
        floor_storage_bytes(1000, 250, nodes=0)
    with pytest.raises(ValueError, match=r"^device_bytes must"):
        floor_storage_bytes(1000, 250, device_bytes=0)


SMALL = 6_000  # a small record: the device reads it as two 4 KiB pages


@pytest.mark.parametrize("policy", ["lru", "minio"])
def test_small_records_cost_storage_whole_pages(policy: str) -> None:
    records, cache = 1000, 500 * 2 * PAGE  # memory for half the records' pages
    result = simulate(policy, dataset_bytes=records * SMALL, cache_bytes=cache, record_bytes=SMALL, epochs=2)
    held = cache // SMALL if policy == "minio" else cache // (2 * PAGE)  # packed, or whole pages
    assert (result.device_record_bytes, result.cache_records) == (2 * PAGE, held)
    first, second = result.epochs
    assert first.storage_bytes == records * 2 * PAGE
    assert second.storage_bytes == round((1 - second.hit_rate) * records) * 2 * PAGE
    if policy == "minio":
        assert second.hit_rate == held / records == 0.682  # 682 of 1000 where pages hold 500
        assert second.storage_bytes == simulation_to_json(result)["simulations"][0]["floor_storage_bytes"]


def test_page_bytes_of_one_counts_the_records_own_bytes() -> None:
    result = simulate(
        "minio", dataset_bytes=1000 * SMALL, cache_bytes=250 * SMALL, record_bytes=SMALL, page_bytes=1
    )
    assert result.device_record_bytes == SMALL
    assert [e.storage_bytes for e in result.epochs] == [1000 * SMALL, 750 * SMALL, 750 * SMALL]


@pytest.mark.parametrize("nodes", [1, 4])
def test_simulate_all_compares_every_policy(nodes: int) -> None:
    results = simulate_all(dataset_bytes=4000 * RB, cache_bytes=1000 * RB, record_bytes=RB, nodes=nodes)
    expected = list(POLICIES) if nodes > 1 else ["lru", "minio"]
    assert [r.policy for r in results] == expected
    assert all(isinstance(r, SimulationResult) and len(r.epochs) == 3 for r in results)


@pytest.mark.parametrize("scaled", [False, True])
def test_table_and_json_show_every_policy_and_epoch(scaled: bool) -> None:
    records = 40_000 if scaled else 4000
    sizes = dict(dataset_bytes=records * RB, cache_bytes=records // 4 * RB, record_bytes=RB, nodes=2)
    results = simulate_all(**sizes, max_records=4000)
    table = format_simulation(results)
    rows = [line.split() for line in table.splitlines()]
    for policy in POLICIES:
        assert [row[1] for row in rows if row and row[0] == policy] == ["1", "2", "3"]
    assert ("reduced scale" in table) is scaled
    assert f"{records:,} records" in table
    data = json.loads(json.dumps(simulation_to_json(results)))
    assert [s["policy"] for s in data["simulations"]] == list(POLICIES)
    assert all([e["epoch"] for e in s["epochs"]] == [1, 2, 3] for s in data["simulations"])
    assert data["simulations"][0]["floor_storage_bytes"] == floor_storage_bytes(
        records * RB, records // 4 * RB, 2
    )


def test_table_refuses_mixed_setups() -> None:
    one = simulate("minio", dataset_bytes=1000 * RB, cache_bytes=100 * RB, record_bytes=RB)
    other = simulate("minio", dataset_bytes=2000 * RB, cache_bytes=100 * RB, record_bytes=RB)
    assert "minio" in format_simulation(one)
    with pytest.raises(ValueError, match="one setup"):
        format_simulation((one, other))


def test_table_gives_storage_of_all_nodes_together_and_per_node() -> None:
    # 4,000 records, 2 nodes of 1,000 each: partitioned, the steady epochs read the 2,000 records none holds
    results = simulate_all(dataset_bytes=4000 * RB, cache_bytes=1000 * RB, record_bytes=RB, nodes=2, epochs=2)
    lines = format_simulation(results).splitlines()
    assert "storage: device bytes (whole pages), all nodes together; network: the records' bytes" in lines
    floor = next(line for line in lines if line.startswith("storage floor"))
    assert floor.endswith(f"across nodes): {2000 * RB / 1e6:.2f} MB ({1000 * RB / 1e6:.2f} MB per node)")
    assert lines[lines.index("") + 1].split()[6:] == ["storage", "per", "node", "network"]
    steady = next(line.split() for line in lines if line.startswith("minio-partitioned") and " 2 " in line)
    assert steady[5:9] == [f"{2000 * RB / 1e6:.2f}", "MB", f"{1000 * RB / 1e6:.2f}", "MB"]


def test_table_of_one_node_has_no_per_node_column() -> None:
    results = simulate_all(dataset_bytes=4000 * RB, cache_bytes=1000 * RB, record_bytes=RB)
    lines = format_simulation(results).splitlines()
    assert "storage: device bytes (whole pages); network: the records' bytes" in lines
    assert lines[lines.index("") + 1].split()[6:] == ["storage", "network"]
