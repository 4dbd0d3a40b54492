"""``analyze`` and ``compare``: one handler, one ladder of exit codes, whatever is analysed.

A target is what the runs run: a generated workload (``Generated``), the user's own command after ``--``
(``stallbench.cli.user.Command``), or the concurrent jobs of ``compare --jobs``
(``stallbench.cli.jobs.Concurrent``). Each prepares itself (usage errors), says how many steps its runs
take, yields a result per loader, prints and writes those done, and finishes (``--apply``). The handler is
the same for all:

* 2: a usage error while preparing, or a storage condition the machine cannot enforce (the loaders done
  before it was found printed and written);
* 1: a run failed, while preparing (the memory probe) or after (the command's exit code and last lines, or
  the error); the loaders done are printed and written;
* 128 + the signal's number on Ctrl-C, SIGTERM or SIGHUP, the loaders done printed and written;
* 0: every report printed and written.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from stallbench.analysis.analyze import analyze
from stallbench.analysis.phases import RunPlan
from stallbench.analysis.request import AnalysisRequest
from stallbench.analysis.results import LoaderReport
from stallbench.analysis.runs import PHASES, Job
from stallbench.cli.commands import Progress, prepare_data, report_outputs, say_error
from stallbench.cli.stops import say_stopped
from stallbench.conditions.cgroup import StorageConditionUnavailable
from stallbench.conditions.limits import AUTO

__all__ = ["Generated", "Target", "analysis_steps", "run_target"]


class Target(Protocol):
    """What ``analyze`` or ``compare`` runs."""

    progress: tuple[str, str]  # the progress bar's description and unit
    name: ClassVar[str]  # how a usage error names it
    refuses: ClassVar[Mapping[str, str]]  # the options (argparse's dest) it does not honour, each with why

    def prepare(self, args: argparse.Namespace) -> None:
        """Make ready to run; ValueError, OSError or StorageConditionUnavailable for a usage error."""

    def steps(self) -> int:
        """The steps of its runs, for the progress bar."""

    def results(self, on_step: Callable[[str], None]) -> Iterator[Any]:
        """One result per loader, yielded as each is done."""

    def write(self, args: argparse.Namespace, done: Sequence[Any]) -> None:
        """Print and write the results ``done`` (none: nothing)."""

    def finish(self, done: Sequence[Any]) -> None:
        """After the results are printed and written (``--apply``)."""


def run_target(args: argparse.Namespace, target: Target) -> int:
    """Prepare, run with progress, print and write what was done (even when a run failed or was stopped)."""
    done: list[Any] = []
    try:
        target.prepare(args)
    except (StorageConditionUnavailable, ValueError, OSError) as exc:
        say_error(args.command, exc)
        return 2
    except RuntimeError as exc:  # a run while preparing failed (the --memory-limit auto probe, a conversion)
        say_error(args.command, exc)
        return 1
    except KeyboardInterrupt as stop:
        return _stopped(args, stop, target, done)
    try:
        with Progress(args, *target.progress, total=target.steps()) as bar:
            done.extend(target.results(bar.step))
    except KeyboardInterrupt as stop:
        return _stopped(args, stop, target, done)
    except StorageConditionUnavailable as exc:
        say_error(args.command, exc)
        target.write(args, done)
        return 2
    except (RuntimeError, OSError, ValueError) as exc:  # a command failed, no training loader, an error
        say_error(args.command, exc)
        target.write(args, done)
        return 1
    target.write(args, done)
    target.finish(done)
    return 0


def _stopped(args: argparse.Namespace, stop: KeyboardInterrupt, target: Target, done: Sequence[Any]) -> int:
    """Ctrl-C, SIGTERM or SIGHUP: say so, print and write what was done; 128 + the signal's number."""
    status = say_stopped(args.command, stop, bool(done))
    target.write(args, done)
    return status


def analysis_steps(job: Job, kinds: Sequence[str]) -> int:
    """The steps ``analyze`` tells of ``job``: the memory probe (``--memory-limit auto``), each column's three
    runs and the machine measured once."""
    return (job.limits.memory_limit == AUTO) + len(PHASES) * len(job.variants(kinds)) + 1


class Generated:
    """A generated workload (or data on disk the options describe): generated and converted by ``prepare``,
    its memory limit sized by ``analyze``."""

    progress = ("runs", "run")
    name = "a generated workload (no command after --)"
    refuses: ClassVar[Mapping[str, str]] = {
        "steps": "a generated workload runs whole epochs",
        "time_limit": "a generated workload runs whole epochs",
        "quiet": "a generated workload prints nothing of its own",
        "log": "a generated workload prints nothing of its own",
        "apply": "it reruns your command; for a generated workload, analyze with the advised settings",
    }

    def __init__(self, req: AnalysisRequest, kinds: Sequence[str], by_epoch: bool = False) -> None:
        self.req, self.kinds, self.by_epoch = req, tuple(kinds), by_epoch
        self.plan: RunPlan | None = None

    def prepare(self, args: argparse.Namespace) -> None:
        self.plan = prepare_data(args, self.req, self.kinds)  # generated and converted: its runs come after

    def steps(self) -> int:
        return analysis_steps(self.plan, self.kinds)

    def results(self, on_step: Callable[[str], None]) -> Iterator[LoaderReport]:
        return analyze(self.plan, self.kinds, on_step=on_step)

    def write(self, args: argparse.Namespace, done: Sequence[LoaderReport]) -> None:
        report_outputs(args, done, self.by_epoch)

    def finish(self, done: Sequence[LoaderReport]) -> None:
        pass
