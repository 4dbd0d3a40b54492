"""A generated workload as a target of the three differential runs (``runs.three_runs``): each run is the
generated job (``stallbench.jobs.workload``) run as a command under the bootstrap (``jobs.command``), as the
user's own command is, so both kinds of job are measured, replayed and recorded one way. Its ingestion run
replays the first batches the prep run's loader makes, as many an epoch as that run handed out.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from stallbench.analysis.request import local_files
from stallbench.analysis.results import Workload
from stallbench.analysis.runs import Phase, three_runs
from stallbench.analysis.training import replay_lengths
from stallbench.conditions.cgroup import StorageLimits
from stallbench.jobs.command import CommandRun, run_command
from stallbench.jobs.converted import existing_copy
from stallbench.jobs.kinds import KINDS
from stallbench.jobs.run import scratch_cache_dir
from stallbench.jobs.spec import JobSpec, WorkloadJob

__all__ = ["RunPlan", "WorkloadRuns", "files_read", "run_phases"]


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

    def job(self, kind: str, data: str, packing: str | None = None, **options: Any) -> WorkloadJob:
        """What the generated job trains on with loader ``kind`` over ``data``; ``options``: the rest of the
        WorkloadJob (our cache's, a group's)."""
        w = self.workload
        return WorkloadJob(
            kind,
            data,
            epochs=w.epochs,
            workers=w.workers,
            batch_size=w.batch_size,
            transform=self.transform,
            compute=w.compute,
            seed=self.seed,
            packing=packing,
            max_len=self.max_len if packing else None,
            persistent_workers=self.max_batches is None,
            **options,
        )

    def argv(self) -> list[str]:
        """The generated job's command, less its WorkloadJob file (``run_command`` adds it)."""
        script = [self.job_script] if self.job_script else ["-m", "stallbench.jobs.workload"]
        return [sys.executable, *script]

    def run_job(self, job: WorkloadJob, spec: JobSpec, limits: StorageLimits | None = None) -> CommandRun:
        """The generated ``job`` run once under ``spec``; what it writes is kept only for the error, should
        it fail."""
        with open(os.devnull, "w") as quiet:
            return run_command(self.argv(), spec, limits=limits, log=quiet, job=job)


def files_read(data: str, kind: str) -> list[str]:
    """The local files ``kind`` reads of the workload's ``data``: its copy in the kind's own format, the data
    itself, or none for data in object storage (fetched over the network)."""
    return [str(existing_copy(data, kind))] if KINDS[kind].converts else local_files(data)


def run_phases(plan: RunPlan, kind: str, packed: bool = False) -> Iterator[tuple[Phase, CommandRun]]:
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
    ) -> CommandRun:
        plan, w = self.plan, self.plan.workload
        cache_dir = scratch_cache_dir()
        ours = dict(cache_bytes=cache_bytes or w.dataset_bytes, cache_dir=str(cache_dir))
        data = plan.in_memory_data if plan.in_memory_data and phase != "cold" else w.data
        job = plan.job(self.kind, data, self.packing, **(ours if KINDS[self.kind].cached else {}))
        spec = JobSpec(
            out_dir="",
            mode="ingestion" if phase == "ingestion" else "pipeline",
            steps=plan.max_batches,
            epochs=w.epochs,
            data=(data,),
            replay_lengths=replay_lengths(prep.records) if prep else {},
        )
        try:
            return plan.run_job(job, spec, limits)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
