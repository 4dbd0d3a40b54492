"""``compare --jobs N`` (N >= 2): N concurrent jobs per loader instead of the differential runs, as a target
of the one handler (``stallbench.cli.targets``), whose exit codes it has: 2 for a usage error, 1 when a job
fails (the loaders done so far are still printed and written), 128 + the signal's number on Ctrl-C, SIGTERM
or SIGHUP (every job's session killed first, and what was done written).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import ClassVar

from stallbench.analysis.concurrent import ConcurrentRun, run_concurrent
from stallbench.analysis.phases import RunPlan
from stallbench.cli.commands import prepare_data, request_from
from stallbench.cli.targets import Generated
from stallbench.conditions.limits import Limits

__all__ = ["Concurrent"]


class Concurrent:
    """``args.jobs`` copies of the generated job at once per loader of ``args.loaders``, run warm."""

    name = "compare --jobs"
    refuses: ClassVar[Mapping[str, str]] = {
        **Generated.refuses,
        **{limit.name: "its jobs run warm, without a cgroup, yet" for limit in dataclasses.fields(Limits)},
        "plot": "it draws nothing yet",
        "packing": "it does not pack yet",
    }

    def __init__(self) -> None:
        self.plan: RunPlan | None = None

    def prepare(self, args: argparse.Namespace) -> None:
        self.args = args
        self.progress = (f"{args.jobs} jobs at once", "loader")
        self.plan = prepare_data(args, request_from(args), args.loaders, cold=False)

    def steps(self) -> int:
        return len(self.args.loaders)

    def results(self, on_step: Callable[[str], None]) -> Iterator[ConcurrentRun]:
        return run_concurrent(self.plan, self.args.loaders, self.args.jobs, on_step=on_step)

    def write(self, args: argparse.Namespace, done: Sequence[ConcurrentRun]) -> None:
        """Print the tables and write the JSON, for whatever loaders are done."""
        if not done or self.plan is None:
            return
        from stallbench.report.concurrent import format_concurrent, write_concurrent_json

        print(format_concurrent(done, self.plan.workload))
        if args.json is not None:
            write_concurrent_json(done, self.plan.workload, args.json)
            print(f"JSON written to {args.json}")

    def finish(self, done: Sequence[ConcurrentRun]) -> None:
        pass
