"""``analyze`` / ``compare`` with a command after ``--``: the user's own job, run three times per loader.

Exit codes as for the other commands, and: 1 with the command's exit code and last lines when the command
fails (no stallbench traceback), 130 on Ctrl-C, 143 on SIGTERM, 129 on SIGHUP (the command's processes,
cgroup and scratch folders gone).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import IO

from stallbench.analysis.apply import NotRunnable, apply_advice
from stallbench.analysis.results import LoaderReport
from stallbench.analysis.user_analysis import UserJob, analyze_command, sized_memory
from stallbench.analysis.user_report import NoTrainingLoader
from stallbench.conditions.cgroup import StorageConditionUnavailable
from stallbench.conditions.limits import AUTO
from stallbench.conditions.storage import dataset_size
from stallbench.jobs.command import CommandFailed
from stallbench.jobs.kinds import SWAPPABLE
from stallbench.jobs.spec import AS_IS

__all__ = ["run_user_analysis", "split_command"]


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """stallbench's own arguments and the user's command: what comes after the first ``--``."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def _job(args: argparse.Namespace, command: list[str]) -> UserJob:
    """The job from the options; ValueError (a usage error) for what a user command cannot take."""
    from stallbench.analysis.request import NamedWorkload, ObjectData, cache_bytes

    if isinstance(args.data, NamedWorkload):
        raise ValueError(
            f"--data must name the files your command reads, not a generated workload ({args.data})"
        )
    if isinstance(args.data, ObjectData):
        raise ValueError(
            f"--data {args.data}: with a command, --data names the local files it reads (what your script "
            "fetches over the network is not counted yet); object storage is measured on a generated job"
        )
    data = args.data.resolve()
    size = dataset_size(data)
    cache = cache_bytes(args.cache, size.device_bytes)
    return UserJob(
        argv=tuple(command),
        data=(data,),
        dataset_bytes=size.device_bytes,
        record_bytes=size.record_bytes,
        cache_bytes=cache,
        limits=args.limits,
        steps=args.steps,
        epochs=args.epochs,
        time_limit=args.time_limit,
    )


@contextlib.contextmanager
def _log(args: argparse.Namespace) -> Iterator[IO[str] | None]:
    """Where the command's output goes: through (None), or to ``--quiet``'s log file."""
    if not args.quiet:
        yield None
        return
    with open(args.log, "a", encoding="utf-8") as log:
        yield log


def run_user_analysis(args: argparse.Namespace, command: list[str]) -> int:
    from stallbench.cli.commands import Progress, interrupted, report_outputs, say_error

    kinds = (AS_IS,) if args.command == "analyze" and args.loader is None else _kinds(args)
    try:
        _check_swappable(kinds)
        job = _job(args, command)
    except (ValueError, OSError) as exc:
        say_error(args.command, exc)
        return 2
    reports: list[LoaderReport] = []
    try:
        sizing = job.limits.memory_limit == AUTO
        with _log(args) as log, Progress(args, "runs", unit="run", total=sizing + 1 + 3 * len(kinds)) as bar:
            if sizing:
                job = sized_memory(job, kinds, log)
                bar.step("memory measured")
            for report in analyze_command(job, kinds, on_step=bar.step, log=log):
                reports.append(report)
    except KeyboardInterrupt as stop:
        return interrupted(args, stop, reports)
    except CommandFailed as exc:
        say_error(args.command, exc)
        return 1
    except StorageConditionUnavailable as exc:
        say_error(args.command, exc)
        return 2
    except (NoTrainingLoader, RuntimeError, OSError, ValueError) as exc:
        say_error(args.command, exc)
        report_outputs(args, reports)
        return 1
    report_outputs(args, reports)
    if args.apply:
        _apply(args, job, reports, kinds)
    if args.quiet:
        print(f"the command's output is in {args.log}", file=sys.stderr)
    return 0


def _apply(
    args: argparse.Namespace, job: UserJob, reports: Sequence[LoaderReport], kinds: Sequence[str]
) -> None:
    """``--apply``: each report's advised setting run cold, predicted against measured."""
    for report, kind in zip(reports, kinds, strict=True):
        if not report.predictions:
            print(f"--apply ({report.loader}): no what-if to apply; run without --steps")
            continue
        try:
            with _log(args) as log:
                applied = apply_advice(job, report, kind, log)
        except NotRunnable as exc:
            print(f"--apply ({report.loader}): not run: {exc}")
            continue
        except (CommandFailed, NoTrainingLoader) as exc:
            print(f"--apply ({report.loader}): the advised run failed: {exc}")
            continue
        if applied is None:
            print(f"--apply ({report.loader}): the advice names no setting to run")
            continue
        print(f"--apply ({report.loader}): {applied.said()}")


def _check_swappable(kinds: tuple[str, ...]) -> None:
    """ValueError naming a loader that reads its own format: a command builds its loaders, and only ours and
    torch's can stand in for them."""
    other = [k for k in kinds if k not in (AS_IS, *SWAPPABLE)]
    if other:
        raise ValueError(
            f"{', '.join(other)} reads data converted to its own format, so it runs on a generated job "
            f"(--data FOLDER), not in place of your command's loaders; with a command, choose from "
            f"{', '.join(SWAPPABLE)}"
        )


def _kinds(args: argparse.Namespace) -> tuple[str, ...]:
    if args.command == "analyze":
        return (args.loader,)
    return tuple(args.loaders)
