"""Jobs stallbench runs, and the contracts between the parent and each job's processes (``spec``).

Every job is a command, run one way (``command``) under a :class:`~stallbench.jobs.spec.JobSpec`, with the
bootstrap in each of its Python processes (``child`` and its helpers) writing one ``LoaderEpoch`` per epoch:

- the user's own command (``stallbench analyze -- python train.py``);
- a generated job: a training script stallbench writes itself (``workload``: one loader kind over a dataset,
  ``kinds``, ``data``), what it trains on in a :class:`~stallbench.jobs.spec.WorkloadJob`.

Both count storage bytes and CPU seconds the one way (``counters``).
"""

__all__: list[str] = []
