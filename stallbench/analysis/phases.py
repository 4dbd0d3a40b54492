"""The differential runs: ingestion (T1), prep (T3) and cold (T2), each a job in its own process.

- ingestion: one batch already made, handed to the step again and again through the loader's workers (a
  fresh shared-memory copy each time, freed by the step as a real batch is): T1 is its steps per epoch,
  measured as every run measures its steps (see ``stallbench.jobs.workload``), without the waits for the
  copies;
- prep: every record in memory (page cache warmed; the cached loader's cache holds the whole dataset),
  the full pipeline runs: T3; prep stall = T3 - T1;
- cold: page cache evicted, the chosen storage condition (kernel read throttle, memory limit) and the
  loader as configured, its cache starting empty: T2; fetch stall = T2 - T3.
Steady figures are the mean over epochs 2.. (epoch 1 fills caches); the first epoch's excess is warm-up,
reported apart.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

from stallbench.analysis.results import EpochRecord, RunRecord, Workload, steady
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.load import OtherLoad
from stallbench.conditions.storage import evict_page_cache, warm_page_cache
from stallbench.jobs.kinds import KINDS
from stallbench.jobs.run import run_workload, scratch_cache_dir
from stallbench.jobs.spec import WorkloadJob

__all__ = ["RunPlan", "run_phases", "storage_limits"]

_STAGES = ("fetch_seconds", "decode_seconds", "collate_seconds")
_EPOCH_FIELDS = set(EpochRecord.__dataclass_fields__)


@dataclass(frozen=True)
class RunPlan:
    """How to run one loader kind on the workload (the same plan for every loader of a comparison)."""

    workload: Workload
    transform: str = "train"
    seed: int = 0
    max_batches: int | None = None
    job_script: str | None = None  # a script that calls ``stallbench.jobs.workload.main`` with its transform
    packing: str | None = None  # token data: each loader also runs packed with this algorithm
    max_len: int | None = None  # with packing: tokens per pack at most


def run_phases(plan: RunPlan, kind: str, packed: bool = False) -> Iterator[RunRecord]:
    """The three runs of ``kind`` ("torch" or "cached"), in order; each yielded as soon as it is done.
    ``packed``: its token batches packed with ``plan.packing`` (else padded)."""
    w = plan.workload
    run = partial(_run, plan, kind, packing=plan.packing if packed else None)
    yield run("ingestion", "batches in memory, only the step", mode="ingestion")
    warm_page_cache(w.data)
    full = int(w.dataset_bytes * 1.01) + (64 << 20)  # every record (device bytes: more), its index, a margin
    yield run("prep", "every record in memory (warm)", cache_bytes=full)
    evict_page_cache(w.data)
    yield run("cold", _condition(w), cache_bytes=w.cache_bytes, limits=storage_limits(w))


def _run(
    plan: RunPlan,
    kind: str,
    phase: str,
    condition: str,
    *,
    mode: str = "pipeline",
    cache_bytes: int | None = None,
    limits: StorageLimits | None = None,
    packing: str | None = None,
) -> RunRecord:
    w = plan.workload
    cache_dir = scratch_cache_dir()
    ours = dict(cache_bytes=cache_bytes or w.dataset_bytes, cache_dir=cache_dir) if KINDS[kind].cached else {}
    job = WorkloadJob(
        kind, w.data, epochs=w.epochs, workers=w.workers, batch_size=w.batch_size, transform=plan.transform,
        compute=w.compute, mode=mode, seed=plan.seed, max_batches=plan.max_batches, packing=packing,
        max_len=plan.max_len if packing else None, **ours,
    )  # fmt: skip
    try:
        with limits if limits is not None else nullcontext(), OtherLoad() as load:
            records = run_workload(job, limits, script=plan.job_script)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return _record(phase, condition, records, load.cores)


def _record(phase: str, condition: str, records: list[dict], other_load_cores: float) -> RunRecord:
    epochs = tuple(EpochRecord(**{k: v for k, v in r.items() if k in _EPOCH_FIELDS}) for r in records)
    stages = {
        k.removesuffix("_seconds"): sum(r.get(k, 0.0) for r in steady(records))
        for k in _STAGES
        if k in records[-1]
    }
    last = records[-1]
    timeline = tuple((float(w), float(s)) for w, s in last.get("timeline", []))
    forms = {"cache_form": last.get("cache_form", ""), "cache_form_epochs": last.get("cache_form_epochs", {})}
    return RunRecord(phase, epochs, condition, stages, timeline, other_load_cores, **forms)


def storage_limits(w: Workload) -> StorageLimits | None:
    return StorageLimits.asked(w.storage_bandwidth, w.memory_limit, w.data)


def _condition(w: Workload) -> str:
    parts = ["page cache evicted"]
    if w.storage_bandwidth:
        parts.append(f"storage reads throttled to {w.storage_bandwidth / 1e6:.0f} MB/s by the kernel")
    if w.memory_limit:
        parts.append(f"memory limited to {w.memory_limit / 1e6:.0f} MB by the kernel")
    return ", ".join(parts)
