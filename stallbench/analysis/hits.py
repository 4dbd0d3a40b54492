"""The hit rate of a steady epoch: the cached loader's (MinIO: ``min(1, C / record_bytes)``, the optimum under
random order) and the OS page cache's (the simulated LRU rate of ``C / dataset_bytes``, epoch 2), in device
bytes; a budget of None is the memory available now. ``stallbench.analysis.whatif`` builds on it."""

from __future__ import annotations

import functools
import math

import psutil

from stallbench.jobs.kinds import KINDS, check_kind
from stallbench.simulate import simulate

__all__ = ["cache_budget", "hit_rate", "measured_hit_rate"]

Loader = str  # a kind of ``stallbench.jobs.kinds``


def measured_hit_rate(
    loader: Loader, hits: int, misses: int, storage_bytes: float, dataset_bytes: int
) -> float:
    """What a run's steady epochs measured: a cached loader's hits over its reads (NaN where no read went
    through its cache: a Dataset whose reads it could not serve), or the page cache's share of the data
    that storage did not have to give (``1 - storage / dataset``) for the others."""
    if KINDS[loader].cached:
        return hits / (hits + misses) if hits + misses else math.nan
    return max(0.0, 1 - storage_bytes / dataset_bytes)


def cache_budget(cache_bytes: int | None) -> int:
    """The memory a cache has: ``cache_bytes``, or for None the memory available now."""
    return psutil.virtual_memory().available if cache_bytes is None else cache_bytes


@functools.lru_cache(maxsize=256)
def _lru_hit_rate(dataset_bytes: int, samples: int, cache_bytes: int) -> float:
    """The page cache's rate: ``dataset_bytes`` are device bytes already, so no page rounding is added."""
    record = max(1, dataset_bytes // samples)
    result = simulate(
        "lru",
        dataset_bytes=dataset_bytes,
        cache_bytes=cache_bytes,
        record_bytes=record,
        epochs=2,
        max_records=50_000,
        page_bytes=1,
    )
    return result.epochs[-1].hit_rate


def hit_rate(
    loader: Loader,
    *,
    dataset_bytes: int,
    samples: int,
    cache_bytes: int | None,
    record_bytes: int | None = None,
    over_network: bool = False,
) -> float:
    """Fraction of a steady epoch's reads served from memory (see the module docstring).

    ``dataset_bytes`` are device bytes (whole pages: what the page cache holds); ``record_bytes`` the
    records' own bytes (what the cached loader holds), ``dataset_bytes`` when not given. ``over_network``:
    the data is fetched over the network (object storage), where no page cache holds it."""
    kind = check_kind(loader)
    if cache_bytes is not None and cache_bytes < 0:
        raise ValueError(f"cache_bytes must not be negative, got {cache_bytes!r}")
    if kind.cached and cache_bytes is not None:
        return min(1.0, cache_bytes / (record_bytes or dataset_bytes))
    if over_network:
        return 0.0
    budget = cache_budget(cache_bytes)
    return 1.0 if budget >= dataset_bytes else _lru_hit_rate(dataset_bytes, samples, budget)
