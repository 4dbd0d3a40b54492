"""One loader's report from its three runs, the same for a generated job and the user's own command: the
split (``breakdown``), the figures of the steady cold epochs, the what-if, roofline and advice built on them.

What differs between the two kinds of job is only what they hand in: a generated job's workload and runs
as planned; a command's slowest rank's runs, its workload as the records describe it, its other loaders.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from stallbench.analysis import advice, whatif
from stallbench.analysis.breakdown import breakdown
from stallbench.analysis.hits import measured_hit_rate
from stallbench.analysis.knobs import KNOBS, predicted
from stallbench.analysis.results import Breakdown, LoaderReport, Machine, RunRecord, Workload, steady

__all__ = ["Measurement", "loader_report", "measured_machine"]


@dataclass(frozen=True)
class Measurement:
    """What a report is made of. ``loader`` names the column; ``model`` is the kind whose caching the what-if
    models (the loader that made the batches); ``what_if``: False where the epochs read only a share of the
    data (``said`` then says why instead of the advice); ``note``: a line put before the advice. The
    machine's prep rate comes from the runs' own CPU counts (``measured_machine``), for every kind of job."""

    loader: str
    model: str
    workload: Workload
    runs: Mapping[str, RunRecord]
    storage_bytes_per_s: float  # measured inside the cold run's limits, as many readers as workers
    memory_bytes_per_s: float
    breakdown: Breakdown | None = None  # None: the split of ``runs``
    what_if: bool = True
    said: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # LoaderReport's own fields for this kind of job


def loader_report(m: Measurement) -> LoaderReport:
    """The report of ``m``: every figure from the steady epochs of its cold run."""
    w = m.workload
    b = m.breakdown if m.breakdown is not None else breakdown(m.runs, w.dataset_bytes)
    machine = measured_machine(w, b, m.storage_bytes_per_s, m.memory_bytes_per_s)
    cold_run, prep_load = m.runs["cold"], m.runs["prep"].other_load_cores
    cold = steady(list(cold_run.epochs))
    storage = int(fmean(e.storage_bytes for e in cold))
    hits, misses = sum(e.hits for e in cold), sum(e.misses for e in cold)
    cpu = fmean(e.cpu_seconds for e in cold)
    measured = whatif.Measured(
        w, b, machine, m.model, storage, cpu, cold_run.ready_first, cold_run.slow_again, prep_load
    )
    what_ifs = predicted(measured, cold_run) if m.what_if else {knob.name: () for knob in KNOBS}
    predictions, forms = what_ifs["predictions"], what_ifs["form_predictions"]
    said = advice.advise(measured, predictions, forms) if m.what_if else m.said
    return LoaderReport(
        loader=m.loader,
        workload=w,
        runs=tuple(m.runs.values()),
        breakdown=b,
        storage_bytes=storage,
        dataset_bytes=w.dataset_bytes,
        record_bytes=w.record_bytes,
        hit_rate=measured_hit_rate(m.loader, hits, misses, storage, w.dataset_bytes),
        cpu_utilisation=cpu / (b.epoch_seconds * machine.cores) if b.epoch_seconds else 0.0,
        samples_per_s=fmean(e.samples for e in cold) / b.epoch_seconds,
        machine=machine,
        roofline=whatif.roofline(measured),
        **what_ifs,
        advice=f"{m.note} {said}" if m.note else said,
        slow_sample_count=cold_run.slow_sample_count,
        slow_samples=cold_run.slow_samples,
        slow_again=cold_run.slow_again,
        advised=advice.advised(measured, predictions, forms) if m.what_if else None,
        **m.extra,
    )


def measured_machine(
    w: Workload, b: Breakdown, storage_bytes_per_s: float, memory_bytes_per_s: float
) -> Machine:
    """The machine as the runs found it: its cores, the measured bandwidths, and the prep rate per core, the
    samples of an epoch over the CPU seconds prep took in the prep run (beyond the step's); where that is
    lost in noise, over the prep run's epoch on the cores its workers could use."""
    from stallbench.analysis.measure import available_cores

    cores = available_cores()
    if b.prep_cpu_seconds > 0:
        rate = w.samples / b.prep_cpu_seconds
    else:
        rate = w.samples / (b.warm_epoch_seconds * min(max(w.workers, 1), cores))
    return Machine(cores, storage_bytes_per_s, memory_bytes_per_s, rate)
