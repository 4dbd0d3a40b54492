"""Cache policies under random order: hit rate and storage bytes per epoch, simulated without data.

Model: ``dataset_bytes // record_bytes`` records of equal size; every epoch reads each record once in a fresh
random order (see ``stallbench._policies`` for the order and how it is split across nodes); epoch 1 starts
with empty caches. The device reads whole pages, so a record costs storage its size rounded up to
``page_bytes`` (``device_record_bytes``): storage bytes and the floor are in these device bytes, network
bytes are the records' own. A cache of ``cache_bytes`` per node holds ``cache_bytes // record_bytes``
records where it packs them (``minio``, ``minio-partitioned``) and ``cache_bytes // device_record_bytes``
where it holds pages (``lru``, the OS page cache). A dataset of more than ``max_records`` records is
simulated at ``max_records`` with the same cache/dataset ratio, and byte figures are scaled back up
(``SimulationResult.scale``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from stallbench._grid import grid
from stallbench._policies import FILL, LOCAL, MISS, POLICIES, REMOTE, make_trace
from stallbench.conditions.sizes import format_bytes
from stallbench.conditions.storage import PAGE

__all__ = [
    "POLICIES",
    "SIMULATE_SCHEMA_VERSION",
    "EpochResult",
    "SimulationResult",
    "floor_storage_bytes",
    "format_simulation",
    "simulate",
    "simulate_all",
    "simulation_to_json",
]

SIMULATE_SCHEMA_VERSION = 1  # of ``simulation_to_json``'s JSON


@dataclass(frozen=True)
class EpochResult:
    """One epoch, all nodes together. Rates are fractions of the epoch's reads; hit = local + remote."""

    epoch: int
    hit_rate: float
    local_hit_rate: float
    remote_hit_rate: float
    storage_bytes: int
    network_bytes: int


@dataclass(frozen=True)
class SimulationResult:
    """``records`` and ``cache_records`` (per node) are the real sizes; ``simulated_records`` were run."""

    policy: str
    records: int
    cache_bytes: int  # per node
    cache_records: int  # what this policy's cache holds: packed records, or whole pages for lru
    nodes: int
    record_bytes: int
    device_record_bytes: int  # record_bytes rounded up to whole pages: what one read costs the device
    simulated_records: int
    scale: float
    epochs: tuple[EpochResult, ...]


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        need = "positive" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {need}, got {value!r}")


def _validate(policy: str, sizes: dict[str, int], mins: dict[str, int]) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of: {', '.join(POLICIES)}")
    for name, value in sizes.items():
        _check_int(name, value, mins.get(name, 1))
    if sizes["record_bytes"] > sizes["dataset_bytes"]:
        raise ValueError(
            f"record_bytes must not exceed dataset_bytes, got {sizes['record_bytes']!r} > "
            f"{sizes['dataset_bytes']!r}"
        )


def _epoch_results(
    codes: np.ndarray, records: int, byte_scale: float, device_scale: float
) -> tuple[EpochResult, ...]:
    per_epoch = codes.reshape(-1, records)
    counts = np.stack([(per_epoch == code).sum(axis=1) for code in (MISS, LOCAL, REMOTE, FILL)], axis=1)
    return tuple(
        EpochResult(
            epoch=i + 1,
            hit_rate=float(local + remote) / records,
            local_hit_rate=float(local) / records,
            remote_hit_rate=float(remote) / records,
            storage_bytes=round(float(miss + fill) * device_scale),
            network_bytes=round(float(remote + fill) * byte_scale),
        )
        for i, (miss, local, remote, fill) in enumerate(counts.tolist())
    )


def simulate(
    policy: str,
    *,
    dataset_bytes: int,
    cache_bytes: int,
    record_bytes: int = 112_000,
    epochs: int = 3,
    nodes: int = 1,
    seed: int = 0,
    max_records: int = 200_000,
    page_bytes: int = PAGE,
) -> SimulationResult:
    """Simulate ``policy`` (a name in ``POLICIES``) for ``epochs`` epochs; ``cache_bytes`` is per node.

    ``page_bytes`` is what the device reads at least (1: sizes that are device bytes already)."""
    sizes = {name: value for name, value in locals().items() if name != "policy"}  # every keyword, as given
    _validate(policy, sizes, mins={"cache_bytes": 0, "seed": 0})
    device_record = -(-record_bytes // page_bytes) * page_bytes
    records = dataset_bytes // record_bytes
    cache_records = cache_bytes // (device_record if policy == "lru" else record_bytes)
    simulated = min(records, max_records)
    scale = records / simulated
    trace = make_trace(simulated, epochs, nodes, seed)
    codes = POLICIES[policy](trace, round(cache_records / scale))
    per_epoch = _epoch_results(codes, simulated, record_bytes * scale, device_record * scale)
    return SimulationResult(
        policy,
        records,
        cache_bytes,
        cache_records,
        nodes,
        record_bytes,
        device_record,
        simulated,
        scale,
        per_epoch,
    )


def simulate_all(
    *,
    dataset_bytes: int,
    cache_bytes: int,
    record_bytes: int = 112_000,
    epochs: int = 3,
    nodes: int = 1,
    seed: int = 0,
    max_records: int = 200_000,
    page_bytes: int = PAGE,
) -> tuple[SimulationResult, ...]:
    """Every policy on the same reads, side by side (``minio-partitioned`` only when ``nodes > 1``)."""
    kwargs = dict(locals())  # every keyword, as given
    return tuple(simulate(name, **kwargs) for name in POLICIES if name != "minio-partitioned" or nodes > 1)


def floor_storage_bytes(
    dataset_bytes: int, cache_bytes: int, nodes: int = 1, *, device_bytes: int | None = None
) -> int:
    """MinIO's bound on storage bytes per epoch after the first: ``(1 - min(1, N*C/D)) * D``.

    ``dataset_bytes`` are the records' bytes, which a packed cache holds; with ``device_bytes`` (the same
    records in whole pages, what the device reads) the bound is that share of ``device_bytes``."""
    checks = (("dataset_bytes", dataset_bytes), ("cache_bytes", cache_bytes), ("nodes", nodes))
    for name, value in (*checks, ("device_bytes", dataset_bytes if device_bytes is None else device_bytes)):
        _check_int(name, value, 0 if name == "cache_bytes" else 1)
    missed = max(0, dataset_bytes - nodes * cache_bytes)
    return missed if device_bytes is None else round(missed * device_bytes / dataset_bytes)


def _floor(result: SimulationResult) -> int:
    """Storage bytes of the records no packed cache can hold, in device bytes."""
    size, records = result.record_bytes, result.records
    packed = result.cache_bytes // size * size  # whole records, as the simulated caches hold them
    device = records * result.device_record_bytes
    return floor_storage_bytes(records * size, packed, result.nodes, device_bytes=device)


def _setup_lines(first: SimulationResult) -> list[str]:
    size, device, nodes = first.record_bytes, first.device_record_bytes, first.nodes
    lines = [
        f"dataset: {first.records:,} records of {format_bytes(size)} ({format_bytes(first.records * size)}); "
        f"in whole pages {format_bytes(device)} ({format_bytes(first.records * device)})",
        f"cache: {format_bytes(first.cache_bytes)} per node, {nodes} node{'s' * (nodes > 1)}; it holds "
        f"{first.cache_bytes // size:,} records packed (minio), {first.cache_bytes // device:,} "
        "in pages (lru)",
        "each epoch reads every record once in a fresh random order; epoch 1 starts with empty caches",
        f"storage: device bytes (whole pages){', all nodes together' if nodes > 1 else ''}; "
        "network: the records' bytes",
    ]
    if first.scale > 1:
        lines.append(
            f"simulated at reduced scale: {first.simulated_records:,} records, same cache/dataset "
            f"ratio; byte figures scaled up {first.scale:,.4g}x"
        )
    where = " with the cache partitioned across nodes" if nodes > 1 else ""
    floor = _floor(first)
    per_node = f" ({format_bytes(floor / nodes)} per node)" if nodes > 1 else ""
    lines.append(
        f"storage floor per epoch after the first (MinIO bound{where}): {format_bytes(floor)}{per_node}"
    )
    return lines


def _row(r: SimulationResult, e: EpochResult) -> tuple[str, ...]:
    """One epoch of one policy; with several nodes, its storage bytes per node beside all nodes' together."""
    per_node = (format_bytes(e.storage_bytes / r.nodes),) if r.nodes > 1 else ()
    rates = (f"{e.hit_rate:.3f}", f"{e.local_hit_rate:.3f}", f"{e.remote_hit_rate:.3f}")
    storage = (format_bytes(e.storage_bytes), *per_node)
    return (r.policy, str(e.epoch), *rates, *storage, format_bytes(e.network_bytes))


def format_simulation(results: SimulationResult | tuple[SimulationResult, ...]) -> str:
    """A plain-text table of one setup's results (as ``simulate_all`` gives), a row per policy and epoch."""
    results = (results,) if isinstance(results, SimulationResult) else tuple(results)
    setups = {
        (r.records, r.cache_bytes, r.nodes, r.record_bytes, r.device_record_bytes, r.scale) for r in results
    }
    if len(setups) != 1:
        raise ValueError(f"results must describe one setup, got {len(setups)}")
    per_node = ("per node",) if results[0].nodes > 1 else ()
    header = ["epoch", "hit rate", "local", "remote", "storage", *per_node, "network"]
    rows = [(row[0], list(row[1:])) for row in (_row(r, e) for r in results for e in r.epochs)]
    return "\n".join([*_setup_lines(results[0]), "", *grid("policy", header, rows)])


def simulation_to_json(results: SimulationResult | tuple[SimulationResult, ...]) -> dict:
    """``{"schema": "stallbench.simulate/<n>", "simulations": [...]}``: each result as a dict, with its
    ``floor_storage_bytes`` (published as ``docs/stallbench-simulate.schema.json``)."""
    results = (results,) if isinstance(results, SimulationResult) else tuple(results)
    simulations = [asdict(r) | {"floor_storage_bytes": _floor(r)} for r in results]
    return {"schema": f"stallbench.simulate/{SIMULATE_SCHEMA_VERSION}", "simulations": simulations}
