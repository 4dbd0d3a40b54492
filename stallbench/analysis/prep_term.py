"""The what-if's prep term: the time an epoch's prep takes with ``w`` workers on ``n`` cores.

It is built on CPU seconds the runs counted, which do not grow when other work shares the cores: ``C``,
prep's CPU per epoch (``samples / prep rate per core``: the prep run's CPU beyond the step's) and ``S``, the
step's, alone (the ingestion run's). Prep takes ``max(F_w + a_w * max((C + L) / w, C / min(w, n)), (S + C) /
n)``: the wait for the first batch, then each worker works through the rest of its share with no more than
``n`` cores decoding at once; and never less than all the CPU (the first batch's included) on the ``n``
cores the step and the workers share. ``a_w = (ceil(B / w) - 1) * w / B`` is the part of a worker's share
left after its first batch: the busiest worker makes ``ceil(B / w)`` of the epoch's ``B`` batches, and the
first is in ``F_w``: counted twice, it weighs most where each worker makes few batches.

``F_w`` is the prep run's wait for its first batch (``F``: workers start and each makes a batch), longer where
more workers than cores start at once and share them, in the share of prep that is CPU (``c = C / (C + L)``):
``F * s(w) / s(w_measured)``, ``s(w) = 1 - c + c * max(1, w / n)``: workers that start together stay in step,
decoding at once (stretching only where the workers ask more cores, ``w c``, than there are, as the share
does, predicted 4 sleeping workers on 2 cores 8% short of the measured epoch and 8 of them 18%). With no
worker, prep and step take turns in one process: ``T1 + C + L``.

``L`` is the time workers spend off the CPU (a Dataset that sleeps, waits on a lock or on a remote read): what
the rest of the prep run's epoch (``T3 - F``, all records in memory) leaves unexplained, ``(T3 - F) * w / a_w
- C``; none where the CPU terms reach 90% of it (on the cores the job had: other work on the machine during
the prep run takes its cores out, so waiting for a core is not read as time off it), or where compute hid
prep (``T3`` within 5% of ``T1``) and the run says nothing of it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stallbench.analysis.whatif import Measured

__all__ = ["prep_seconds"]

CPU_EXPLAINS = 0.9  # CPU terms that reach this share of the prep run's epoch explain it
PREP_HIDDEN = 1.05  # a prep run's epoch within this factor of the steps alone: prep was hidden


def prep_seconds(m: Measured, workers: int) -> float:
    """Prep time of an epoch with ``workers`` (the module docstring's formula)."""
    cpu = _prep_cpu(m)
    off_cpu = _off_cpu_seconds(m, cpu)
    if workers == 0:
        return m.breakdown.step_alone_seconds + cpu + off_cpu
    cores = m.machine.cores
    first = _first_batch(m, workers, cpu / (cpu + off_cpu) if cpu + off_cpu > 0 else 1.0)
    share = max(cpu / min(workers, cores), (cpu + off_cpu) / workers)
    each = first + share * _after_first(m, workers)
    return max(each, (m.breakdown.step_cpu_seconds + cpu) / cores)


def _after_first(m: Measured, workers: int) -> float:
    """The part of a worker's share it makes after ``F_w``: the busiest worker makes ``ceil(B / w)`` of the
    epoch's ``B`` batches, its first one in ``F_w``."""
    batches = max(1, math.ceil(m.workload.samples / m.workload.batch_size))
    return (math.ceil(batches / workers) - 1) * workers / batches


def _first_batch(m: Measured, workers: int, on_cpu: float) -> float:
    """``F_w``: all ``workers`` start and make a first batch at once; its ``on_cpu`` share (prep's CPU over
    its CPU and off-CPU time) stretches where they outnumber the cores, the rest does not."""
    cores, measured = m.machine.cores, m.workload.workers
    stretch = lambda w: 1.0 - on_cpu + on_cpu * max(1.0, w / cores)  # noqa: E731
    return m.breakdown.warm_first_batch_seconds * stretch(workers) / stretch(measured)


def _prep_cpu(m: Measured) -> float:
    return m.workload.samples / m.machine.prep_samples_per_s_per_core


def _cpu_bound(m: Measured, cpu: float, workers: int, after: float) -> float:
    """The prep run's prep CPU after the first batch on ``min(workers, cores)`` cores, and all of it on the
    cores shared with the step: the cores the job had, those other work on the machine kept busy left out
    (workers that waited for a core are not off the CPU: more of them would wait as well)."""
    cores = max(1.0, m.machine.cores - m.prep_other_load)
    return max(after * cpu / min(workers, cores), (m.breakdown.step_cpu_seconds + cpu) / cores)


def _off_cpu_seconds(m: Measured, cpu: float) -> float:
    """``L``: the prep run's worker time its CPU (``cpu``) does not explain, per epoch, all workers
    together. After the first batch, the prep run's epoch is the ``a_w`` of each worker's share left."""
    b, workers = m.breakdown, m.workload.workers
    if workers == 0:
        return max(0.0, b.warm_epoch_seconds - b.step_alone_seconds - cpu)
    rest = b.warm_epoch_seconds - b.warm_first_batch_seconds
    after = _after_first(m, workers)
    hidden = b.warm_epoch_seconds <= PREP_HIDDEN * b.step_alone_seconds
    if hidden or after == 0 or _cpu_bound(m, cpu, workers, after) >= CPU_EXPLAINS * rest:
        return 0.0
    return max(0.0, rest * workers / after - cpu)
