"""``compare --jobs N`` (N >= 2): N concurrent jobs per loader instead of the differential runs.

Exit codes as for the other commands: 2 for a usage error, 1 when a job fails (the loaders done so far are
still printed and written), 130 on Ctrl-C, 143 on SIGTERM, 129 on SIGHUP (every job's session killed
first, and what was done written).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from stallbench.analysis.concurrent import ConcurrentRun, run_concurrent
from stallbench.analysis.results import Workload
from stallbench.cli.commands import Progress, prepare_data, request_from, say_error
from stallbench.cli.stops import say_stopped
from stallbench.conditions.cgroup import StorageConditionUnavailable

__all__ = ["UNSUPPORTED", "run_concurrent_compare"]

# options the concurrent comparison cannot honour yet: it runs warm, draws nothing, and runs without cgroups
# (so it takes no limit either: ``Limits.options``)
UNSUPPORTED = {
    "plot": "--plot",
    "packing": "--packing",
}


def run_concurrent_compare(args: argparse.Namespace) -> int:
    """Prepare the workload (usage errors: 2), run each loader's jobs with progress, print and write."""
    try:
        plan = prepare_data(args, request_from(args), args.loaders, cold=False)
    except (StorageConditionUnavailable, ValueError) as exc:
        say_error(args.command, exc)
        return 2
    except KeyboardInterrupt as stop:
        return _interrupted(args, stop, None, [])
    runs: list[ConcurrentRun] = []
    try:
        with Progress(args, f"{args.jobs} jobs at once", unit="loader", total=len(args.loaders)) as bar:
            for run in run_concurrent(plan, args.loaders, args.jobs, on_step=bar.step):
                runs.append(run)
    except KeyboardInterrupt as stop:
        return _interrupted(args, stop, plan.workload, runs)
    except (RuntimeError, OSError, ValueError) as exc:
        say_error(args.command, exc)
        _outputs(args, plan.workload, runs)
        return 1
    _outputs(args, plan.workload, runs)
    return 0


def _interrupted(
    args: argparse.Namespace,
    stop: KeyboardInterrupt,
    workload: Workload | None,
    runs: Sequence[ConcurrentRun],
) -> int:
    """Ctrl-C, SIGTERM or SIGHUP: say so, write the loaders done so far; exit code 128 + its number."""
    status = say_stopped(args.command, stop, bool(runs))
    if workload is not None:
        _outputs(args, workload, runs)
    return status


def _outputs(args: argparse.Namespace, workload: Workload, runs: Sequence[ConcurrentRun]) -> None:
    """Print the tables and write the JSON, for whatever loaders are done."""
    if not runs:
        return
    from stallbench.report.concurrent import format_concurrent, write_concurrent_json

    print(format_concurrent(runs, workload))
    if args.json is not None:
        write_concurrent_json(runs, workload, args.json)
        print(f"JSON written to {args.json}")
