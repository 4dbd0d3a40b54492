"""``analyze`` / ``compare`` with a command after ``--``: the user's own job, run three times per loader, as
a target of the one handler (``stallbench.cli.targets``, whose exit codes it has: 1 with the command's exit
code and last lines when it fails, no stallbench traceback; on Ctrl-C, SIGTERM or SIGHUP the command's
processes, cgroup and scratch folders are gone before stallbench exits).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, ClassVar

from stallbench.analysis.analyze import analyze
from stallbench.analysis.apply import NotRunnable, apply_advice
from stallbench.analysis.job_report import NoTrainingLoader
from stallbench.analysis.results import LoaderReport
from stallbench.analysis.user_analysis import UserJob
from stallbench.cli.commands import loader_kinds, report_outputs
from stallbench.cli.targets import analysis_steps
from stallbench.conditions.storage import dataset_size
from stallbench.jobs.command import CommandFailed
from stallbench.jobs.kinds import SWAPPABLE
from stallbench.jobs.spec import AS_IS

__all__ = ["Command", "split_command"]


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
    args.limits.check(data, cold=True)
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


class Command:
    """The user's own command after ``--`` as the target of ``analyze`` or ``compare``
    (``stallbench.cli.targets``): its loaders as written, or swapped for torch's or ours; its output through,
    or to ``--log`` with ``--quiet``."""

    progress = ("runs", "run")
    name = "your command after --"
    refuses: ClassVar[Mapping[str, str]] = {  # the command builds its own loaders and runs its own step
        "data_dir": "a generated workload's folder",
        "workers": "your command builds its own DataLoaders (set num_workers there)",
        "batch_size": "your command builds its own DataLoaders (set batch_size there)",
        "compute": "your command runs its own step",
        "transform": "your command's Dataset makes its own samples",
    }

    def __init__(self, command: list[str]) -> None:
        self.command = command

    def prepare(self, args: argparse.Namespace) -> None:
        self.args = args
        as_written = args.command == "analyze" and args.loader is None
        self.kinds = (AS_IS,) if as_written else loader_kinds(args)
        _check_swappable(self.kinds)
        self.job = _job(args, self.command)

    def steps(self) -> int:
        return analysis_steps(self.job, self.kinds)

    def results(self, on_step: Callable[[str], None]) -> Iterator[LoaderReport]:
        with _log(self.args) as log:
            yield from analyze(self.job, self.kinds, on_step=on_step, log=log)

    def write(self, args: argparse.Namespace, done: Sequence[LoaderReport]) -> None:
        report_outputs(args, done)

    def finish(self, done: Sequence[LoaderReport]) -> None:
        if self.args.apply:
            _apply(self.args, self.job, done, self.kinds)
        if self.args.quiet:
            print(f"the command's output is in {self.args.log}", file=sys.stderr)


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
