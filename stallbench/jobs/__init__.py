"""Jobs stallbench runs, and the contracts between the parent and each job's processes (``spec``).

- a generated job: one loader kind (``kinds``) over a dataset, run by ``run`` as ``python -m
  stallbench.jobs.workload`` (``workload``, ``data``);
- the user's own command: ``command`` runs it with a bootstrap in each of its Python processes (``child``
  and its helpers), ``user_analysis`` and ``user_report`` make the three runs and their report.

Both count storage bytes and CPU seconds the one way (``counters``).
"""

__all__: list[str] = []
