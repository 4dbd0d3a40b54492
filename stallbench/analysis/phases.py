"""A generated workload as a ``runs.Job`` of the one method (``analyze.analyze``): each run is the generated
job (``stallbench.jobs.workload``) run as a command under the bootstrap (``jobs.command``), as the user's own
command is, so both kinds of job are measured, replayed, recorded and reported one way. Its ingestion run
replays the first batches the prep run's loader makes, as many an epoch as that run handed out. Data in
object storage is copied to memory for the runs that read no storage (``object_data``), and the machine's
storage bandwidth is the network's.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from stallbench.analysis.measure import measure_bandwidths, measure_memory_bandwidth
from stallbench.analysis.memory import probe_batches, probe_cache_bytes
from stallbench.analysis.object_data import in_memory_copy, network_bandwidth, object_source
from stallbench.analysis.request import local_files
from stallbench.analysis.results import Workload
from stallbench.analysis.runs import Bandwidths, Phase, Variant, three_runs
from stallbench.analysis.training import replay_lengths
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import AUTO, Limits
from stallbench.jobs.command import CommandRun, run_command
from stallbench.jobs.converted import existing_copy
from stallbench.jobs.kinds import KINDS
from stallbench.jobs.run import scratch_cache_dir
from stallbench.jobs.spec import JobSpec, LoaderEpoch, WorkloadJob

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
    converted: tuple[str, ...] = ()  # the kinds that read the data converted to their own format
    auto_memory: bool = False  # --memory-limit auto, not sized yet (``sized`` sets the workload's limit)

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

    @property
    def limits(self) -> Limits:
        asked = self.workload.limits
        return replace(asked, memory_limit=AUTO) if self.auto_memory else asked

    @property
    def dataset_bytes(self) -> int:
        return self.workload.dataset_bytes

    @property
    def cache_bytes(self) -> int | None:
        return self.workload.cache_bytes

    @property
    def steps(self) -> int | None:
        return self.max_batches

    def variants(self, kinds: Sequence[str]) -> list[Variant]:
        """Each kind as the job makes its batches; with ``packing``, each also packed."""
        batching = [(None, None), (self.packing, self.max_len)] if self.packing else [(None, None)]
        return [Variant(kind, *packing) for kind, packing in itertools.product(kinds, batching)]

    def three_runs(self, variant: Variant, log: IO[str] | None = None) -> Iterator[tuple[Phase, CommandRun]]:
        """The generated job's output is kept only for an error (``run_job``): ``log`` is not written."""
        return run_phases(self, variant.kind, packed=variant.packing is not None)

    @contextlib.contextmanager
    def opened(self) -> Iterator[tuple[RunPlan, Callable[[int], Bandwidths]]]:
        """The plan, with data in object storage copied to memory for the runs that read no storage (and
        converted there for each loader that reads its own format, that conversion uploaded beside the data
        for the cold run where the bucket lacks it: one download, one conversion), and its bandwidths: the
        disk's inside the cold run's limits, or the network's (the bucket listed once for both)."""
        w = self.workload
        if local_files(w.data):
            cgroup = w.limits.cgroup(w.data)
            yield self, lambda readers: measure_bandwidths([w.data], limits=cgroup, readers=readers)
            return
        source = object_source(w.data)
        with in_memory_copy(source) as copy:
            for kind in self.converted:  # the copy in memory in each one's own format, beside it (untimed),
                from stallbench.jobs.others import convert  # here: it loads torch

                convert(w.data, kind, made=convert(str(copy), kind))  # and in the bucket, the same one
            yield (
                replace(self, in_memory_data=str(copy)),
                lambda readers: (network_bandwidth(source, readers), measure_memory_bandwidth()),
            )

    def workload_of(self, cold_rows: Sequence[LoaderEpoch]) -> tuple[Workload, float]:
        """The workload as planned, read whole each epoch."""
        return self.workload, 1.0

    def made_by(self, kind: str, cold_rows: Sequence[LoaderEpoch]) -> str:
        """The kind planned: the generated job makes its batches with it."""
        return kind

    def read_by(self, kind: str) -> list[str]:
        return files_read(self.workload.data, kind)

    def memory_probe(
        self, kind: str, cache_dir: Path, limits: StorageLimits, log: IO[str] | None = None
    ) -> list[int]:
        w = self.workload
        steps = probe_batches(w.workers)
        probe = replace(self, workload=replace(w, epochs=1, compute=None), max_batches=steps)
        ours = dict(cache_bytes=probe_cache_bytes(w.samples), cache_dir=str(cache_dir))
        job = probe.job(kind, w.data, **(ours if KINDS[kind].cached else {}))
        run = probe.run_job(job, JobSpec(out_dir="", steps=steps, epochs=1, data=(w.data,)), limits)
        return [r.workers for r in run.records]

    def sized(self, memory_limit: int) -> RunPlan:
        return replace(self, workload=replace(self.workload, memory_limit=memory_limit), auto_memory=False)

    def run_job(self, job: WorkloadJob, spec: JobSpec, limits: StorageLimits | None = None) -> CommandRun:
        """The generated ``job`` run once under ``spec``; what it writes is kept only for the error, should
        it fail."""
        with open(os.devnull, "w") as quiet:
            return run_command(self.argv(), spec, limits=limits, log=quiet, job=job)


def files_read(data: str, kind: str) -> list[str]:
    """The local files ``kind`` reads of the workload's ``data``: its copy in the kind's own format, the data
    itself, or none for data in object storage (fetched over the network, a copy too)."""
    if KINDS[kind].converts and local_files(data):
        return [existing_copy(data, kind)]
    return local_files(data)


def run_phases(plan: RunPlan, kind: str, packed: bool = False) -> Iterator[tuple[Phase, CommandRun]]:
    """The three runs of ``kind`` ("torch" or "cached"), in order; each yielded as soon as it is done.
    ``packed``: its token batches packed with ``plan.packing`` (else padded)."""
    w = plan.workload
    runs = WorkloadRuns(plan, kind, plan.packing if packed else None)
    return three_runs(runs, w.dataset_bytes, w.cache_bytes, w.limits.cgroup(w.data))


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
