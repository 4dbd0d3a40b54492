"""A generated job: a training script stallbench writes itself, run and measured as the user's own command.

``python -m stallbench.jobs.workload JOB.json`` (or a script that calls :func:`main` with a transform or a
step of its own): ``JOB.json`` holds a :class:`~stallbench.jobs.spec.WorkloadJob`, the data, the loader
kind and its settings, the transform and the compute model. The script only trains: it builds its loader
(``stallbench.jobs.data``) and runs each batch through the step for its epochs. Everything a run does to it
(the ingestion run's replayed batches, epochs cut to a number of steps, the limits) and everything measured
of it (waits, steps, storage bytes, CPU, tokens, unique samples, energy) comes from the bootstrap under the
run's :class:`~stallbench.jobs.spec.JobSpec` (``stallbench.jobs.child``), exactly as for
``stallbench analyze -- python train.py``: one method, one record (``LoaderEpoch``), for both kinds of job.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from stallbench.compute import parse_compute
from stallbench.jobs._ending import end_process
from stallbench.jobs.data import make_loader
from stallbench.jobs.spec import WorkloadJob

__all__ = ["main"]


def main(
    argv: Sequence[str] | None = None,
    transform: Callable[[bytes], Any] | None = None,
    step: Callable[[Any], None] | None = None,
) -> int:
    """Train on the job whose JSON file ``argv`` names (default: this process's arguments); ``transform`` and
    ``step`` (the training step per batch) override the job's."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        sys.exit("usage: python -m stallbench.jobs.workload JOB.json (a WorkloadJob as JSON)")
    job = WorkloadJob.read(args[0])
    if transform is None and job.transform != "none":
        transform = job.transform
    torch.manual_seed(job.seed)
    if step is None and job.compute:
        step = parse_compute(job.compute)
    dl = make_loader(job, transform)
    for _epoch in range(job.epochs):
        for batch in dl:
            if step is not None:
                step(batch)
    return 0


if __name__ == "__main__":
    main()
    end_process()  # its epochs are run: measured, it ends without the interpreter's teardown
