"""Cache policies under random order: hit rate and storage bytes per epoch, simulated without data.

Model: ``dataset_bytes // record_bytes`` records of equal size; every epoch reads each record once in a fresh
random order (see ``stallbench._policies`` for the order and how it is split across nodes); epoch 1 starts
with empty caches of ``cache_bytes // record_bytes`` records per node. A dataset of more than
``max_records`` records is simulated at ``max_records`` with the same cache/dataset ratio, and byte figures
are scaled back up (``SimulationResult.scale``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from stallbench._policies import FILL, LOCAL, MISS, POLICIES, REMOTE, make_trace

__all__ = [
    "POLICIES",
    "EpochResult",
    "SimulationResult",
    "floor_storage_bytes",
    "format_simulation",
    "simulate",
    "simulate_all",
    "simulation_to_json",
]


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
    cache_records: int
    nodes: int
    record_bytes: int
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


def _epoch_results(codes: np.ndarray, records: int, byte_scale: float) -> tuple[EpochResult, ...]:
    per_epoch = codes.reshape(-1, records)
    counts = np.stack([(per_epoch == code).sum(axis=1) for code in (MISS, LOCAL, REMOTE, FILL)], axis=1)
    return tuple(
        EpochResult(
            epoch=i + 1,
            hit_rate=float(local + remote) / records,
            local_hit_rate=float(local) / records,
            remote_hit_rate=float(remote) / records,
            storage_bytes=round(float(miss + fill) * byte_scale),
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
) -> SimulationResult:
    """Simulate ``policy`` (a name in ``POLICIES``) for ``epochs`` epochs; ``cache_bytes`` is per node."""
    sizes = dict(dataset_bytes=dataset_bytes, cache_bytes=cache_bytes, record_bytes=record_bytes,
                 epochs=epochs, nodes=nodes, seed=seed, max_records=max_records)  # fmt: skip
    _validate(policy, sizes, mins={"cache_bytes": 0, "seed": 0})
    records, cache_records = dataset_bytes // record_bytes, cache_bytes // record_bytes
    simulated = min(records, max_records)
    scale = records / simulated
    trace = make_trace(simulated, epochs, nodes, seed)
    codes = POLICIES[policy](trace, round(cache_records / scale))
    per_epoch = _epoch_results(codes, simulated, record_bytes * scale)
    return SimulationResult(policy, records, cache_records, nodes, record_bytes, simulated, scale, per_epoch)


def simulate_all(
    *,
    dataset_bytes: int,
    cache_bytes: int,
    record_bytes: int = 112_000,
    epochs: int = 3,
    nodes: int = 1,
    seed: int = 0,
    max_records: int = 200_000,
) -> tuple[SimulationResult, ...]:
    """Every policy on the same reads, side by side (``minio-partitioned`` only when ``nodes > 1``)."""
    kwargs = dict(dataset_bytes=dataset_bytes, cache_bytes=cache_bytes, record_bytes=record_bytes,
                  epochs=epochs, nodes=nodes, seed=seed, max_records=max_records)  # fmt: skip
    return tuple(simulate(name, **kwargs) for name in POLICIES if name != "minio-partitioned" or nodes > 1)


def floor_storage_bytes(dataset_bytes: int, cache_bytes: int, nodes: int = 1) -> int:
    """MinIO's bound on storage bytes per epoch after the first: ``(1 - min(1, N*C/D)) * D``."""
    for name, value in (("dataset_bytes", dataset_bytes), ("cache_bytes", cache_bytes), ("nodes", nodes)):
        _check_int(name, value, 0 if name == "cache_bytes" else 1)
    return max(0, dataset_bytes - nodes * cache_bytes)


def _fmt_bytes(count: float) -> str:
    """Decimal units, as DESIGN.md writes record sizes: 112000 -> '112.00 KB'."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if count < 1000:
            return f"{count:.0f} B" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    return f"{count:.2f} PB"


def _floor(result: SimulationResult) -> int:
    size = result.record_bytes
    return floor_storage_bytes(result.records * size, result.cache_records * size, result.nodes)


def _setup_lines(first: SimulationResult) -> list[str]:
    size, nodes = first.record_bytes, first.nodes
    lines = [
        f"dataset: {first.records:,} records of {_fmt_bytes(size)} ({_fmt_bytes(first.records * size)}); "
        f"cache: {first.cache_records:,} records ({_fmt_bytes(first.cache_records * size)}) per node, "
        f"{nodes} node{'s' if nodes > 1 else ''}",
        "each epoch reads every record once in a fresh random order; epoch 1 starts with empty caches",
    ]
    if first.scale > 1:
        lines.append(f"simulated at reduced scale: {first.simulated_records:,} records, same cache/dataset "
                     f"ratio; byte figures scaled up {first.scale:,.4g}x")  # fmt: skip
    where = " with the cache partitioned across nodes" if nodes > 1 else ""
    lines.append(f"storage floor per epoch after the first (MinIO bound{where}): {_fmt_bytes(_floor(first))}")
    return lines


def format_simulation(results: SimulationResult | tuple[SimulationResult, ...]) -> str:
    """A plain-text table of one setup's results (as ``simulate_all`` gives), a row per policy and epoch."""
    results = (results,) if isinstance(results, SimulationResult) else tuple(results)
    setups = {(r.records, r.cache_records, r.nodes, r.record_bytes, r.scale) for r in results}
    if len(setups) != 1:
        raise ValueError(f"results must describe one setup, got {len(setups)}")
    rows = [("policy", "epoch", "hit rate", "local", "remote", "storage", "network")]
    rows += [
        (r.policy, str(e.epoch), f"{e.hit_rate:.3f}", f"{e.local_hit_rate:.3f}", f"{e.remote_hit_rate:.3f}",
         _fmt_bytes(e.storage_bytes), _fmt_bytes(e.network_bytes))
        for r in results for e in r.epochs
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = [
        "  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)])
        for row in rows
    ]
    return "\n".join([*_setup_lines(results[0]), "", *table])


def simulation_to_json(results: SimulationResult | tuple[SimulationResult, ...]) -> dict:
    """``{"simulations": [...]}``: each result as a dict, with its ``floor_storage_bytes``."""
    results = (results,) if isinstance(results, SimulationResult) else tuple(results)
    return {"simulations": [asdict(r) | {"floor_storage_bytes": _floor(r)} for r in results]}
