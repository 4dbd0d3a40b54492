"""A generated workload as a target of the three differential runs (``runs.three_runs``), each run a job
in its own process (``stallbench.jobs.workload``).

Its ingestion run hands one batch already made to the step again and again through the loader's workers (a
fresh shared-memory copy each time, freed by the step as a real batch is): T1 is its steps per epoch,
measured as every run measures its steps, without the waits for the copies. Steady figures are the mean
over epochs 2.. (epoch 1 fills caches); the first epoch's excess is warm-up, reported apart.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from stallbench.analysis.request import local_files
from stallbench.analysis.results import EpochRecord, RunRecord, Workload, steady
from stallbench.analysis.runs import Phase, cold_condition, three_runs
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.load import OtherLoad
from stallbench.jobs.converted import existing_copy
from stallbench.jobs.kinds import KINDS
from stallbench.jobs.run import run_workload, scratch_cache_dir
from stallbench.jobs.spec import CACHE_FORM_FIELDS, WorkloadJob

__all__ = ["RunPlan", "WorkloadRuns", "files_read", "run_phases"]

_STAGES = ("fetch_seconds", "decode_seconds", "collate_seconds")
_CONDITIONS = {"prep": "every record in memory (warm)", "ingestion": "batches in memory, only the step"}
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
    in_memory_data: str | None = None  # data in object storage copied to memory, for every run but the cold


def files_read(data: str, kind: str) -> list[str]:
    """The local files ``kind`` reads of the workload's ``data``: its copy in the kind's own format, the data
    itself, or none for data in object storage (fetched over the network)."""
    return [str(existing_copy(data, kind))] if KINDS[kind].converts else local_files(data)


def run_phases(plan: RunPlan, kind: str, packed: bool = False) -> Iterator[tuple[Phase, RunRecord]]:
    """The three runs of ``kind`` ("torch" or "cached"), in order; each yielded as soon as it is done.
    ``packed``: its token batches packed with ``plan.packing`` (else padded)."""
    w = plan.workload
    target = WorkloadRuns(plan, kind, plan.packing if packed else None)
    return three_runs(target, w.dataset_bytes, w.cache_bytes, w.limits.cgroup(w.data))


@dataclass(frozen=True)
class WorkloadRuns:
    """One loader kind on the plan's workload, run once per phase."""

    plan: RunPlan
    kind: str
    packing: str | None = None

    def data(self) -> list[str]:
        return files_read(self.plan.workload.data, self.kind)

    def run(
        self, phase: Phase, *, cache_bytes: int | None, limits: StorageLimits | None, prep: Any = None
    ) -> RunRecord:
        plan, w, packing = self.plan, self.plan.workload, self.packing
        cache_dir = scratch_cache_dir()
        cached = KINDS[self.kind].cached
        ours = dict(cache_bytes=cache_bytes or w.dataset_bytes, cache_dir=cache_dir) if cached else {}
        mode = "ingestion" if phase == "ingestion" else "pipeline"
        data = plan.in_memory_data if plan.in_memory_data and phase != "cold" else w.data
        job = WorkloadJob(
            self.kind, data, epochs=w.epochs, workers=w.workers, batch_size=w.batch_size,
            transform=plan.transform, compute=w.compute, mode=mode, seed=plan.seed,
            max_batches=plan.max_batches, packing=packing, max_len=plan.max_len if packing else None, **ours,
        )  # fmt: skip
        try:
            with limits if limits is not None else nullcontext(), OtherLoad() as load:
                records = run_workload(job, limits, script=plan.job_script)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        return _record(phase, _CONDITIONS.get(phase) or cold_condition(w.limits), records, load.cores)


def _record(phase: str, condition: str, records: list[dict], other_load_cores: float) -> RunRecord:
    epochs = tuple(EpochRecord(**{k: v for k, v in r.items() if k in _EPOCH_FIELDS}) for r in records)
    stages = {
        k.removesuffix("_seconds"): sum(r.get(k, 0.0) for r in steady(records))
        for k in _STAGES
        if k in records[-1]
    }
    last = records[-1]
    timeline = tuple((float(w), float(s)) for w, s in last.get("timeline", []))
    forms = {k: last[k] for k in CACHE_FORM_FIELDS if k in last}
    return RunRecord(phase, epochs, condition, stages, timeline, other_load_cores, **forms)
