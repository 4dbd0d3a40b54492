"""The ``stallbench`` command line: ``analyze``, ``compare``, ``simulate`` and ``demo``.

Exit codes: 0 success, 1 failure, 2 usage error (a bad option, missing data, a condition the machine cannot
enforce), 130 interrupted by Ctrl-C, 143 by SIGTERM, 129 by SIGHUP (results so far are written first, and
every job stallbench started is stopped: ``stops``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from stallbench.cli import _args as types
from stallbench.cli.commands import run_analysis, run_demo, run_simulate
from stallbench.cli.stops import say_stopped, stops_as_ctrl_c
from stallbench.cli.targets import Generated, Target, run_target
from stallbench.cli.user import Command, split_command
from stallbench.conditions.limits import AUTO, NONE, Limits
from stallbench.conditions.storage import PAGE
from stallbench.jobs.kinds import CACHED, DEFAULT, NAMES
from stallbench.jobs.spec import PACKINGS

__all__ = ["DEMO_LIMITS", "main", "make_parser"]


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in NAMES]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown loader {unknown or text!r}; choose from: {', '.join(NAMES)}"
        )
    return kinds


def _outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON to FILE")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="also draw the results to FILE.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def _workload(p: argparse.ArgumentParser, data_required: bool = True) -> None:
    p.add_argument(
        "--data", type=types.data_spec, required=data_required, help="a path or images[:N], tokens[:N]"
    )
    p.add_argument(
        "--data-dir", type=types.data_dir, default=Path("stallbench-data"), help="where named workloads go"
    )
    p.add_argument("--workers", type=types.positive_int, default=2)
    p.add_argument("--batch-size", type=types.positive_int, default=64)
    p.add_argument(
        "--compute", type=types.compute_spec, default="emulated:10", help="emulated:<ms>, cpu, cuda"
    )
    p.add_argument("--cache", type=types.cache_spec, default="50%", help="cache size: 50%% or 2G")
    _limits(p, NONE)
    p.add_argument("--epochs", type=types.positive_int, default=3)
    p.add_argument("--transform", choices=("train", "eval", "none"), default="train")
    packing = "token data: each loader also runs packed, as many packs a step as fill a padded step"
    p.add_argument("--packing", choices=PACKINGS, help=packing)
    p.add_argument(
        "--max-len", type=types.positive_int, help="tokens per pack; default: the longest sequence"
    )
    _outputs(p)


class _Limit(argparse.Action):
    """``--storage-bandwidth`` and ``--memory-limit`` resolved once into one value, ``args.limits`` (a
    ``Limits``), each under its own name: from here the value goes whole to the cgroup and the report."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        namespace.limits = dataclasses.replace(namespace.limits, **{self.dest: values})


def _limits(p: argparse.ArgumentParser, default: Limits) -> None:
    said = default.said(unset=False)
    p.add_argument(
        "--storage-bandwidth",
        type=types.bandwidth,
        action=_Limit,
        default=argparse.SUPPRESS,
        help="kernel read throttle, e.g. 200MB/s" + (f" (default: {said[0]})" if said else ""),
    )
    p.add_argument(
        "--memory-limit",
        type=types.memory_spec,
        action=_Limit,
        default=argparse.SUPPRESS,
        help="kernel memory limit per job: SIZE or auto",
    )
    p.set_defaults(limits=default)


def _own_command(p: argparse.ArgumentParser) -> None:
    """Options for a command of the user's own, given after ``--``."""
    own = p.add_argument_group("your own command (after --)")
    own.add_argument("--steps", type=types.positive_int, help="batches per epoch, then the epoch ends early")
    own.add_argument(
        "--time-limit", type=types.seconds, help="seconds a run may take; its finished epochs count"
    )
    own.add_argument("--quiet", action="store_true", help="the command's output to --log, not the terminal")
    own.add_argument("--log", type=Path, default=Path("stallbench-command.log"), help="with --quiet")
    own.add_argument(
        "--apply",
        action="store_true",
        help="then rerun the cold run with the advised setting: predicted vs measured",
    )


def _add_analysis(sub: argparse._SubParsersAction) -> None:
    analyze = sub.add_parser(
        "analyze",
        help="one loader: compute / prep stall / fetch stall, what-if, roofline",
        usage="%(prog)s [options] [-- COMMAND ...]",
    )
    _workload(analyze)
    _own_command(analyze)
    analyze.add_argument(
        "--loader",
        choices=NAMES,
        default=None,
        help=f"one of {', '.join(NAMES)}; default: cached, or with a command the loader it uses",
    )
    compare = sub.add_parser(
        "compare",
        help="several loaders on the same workload, side by side",
        usage="%(prog)s [options] [-- COMMAND ...]",
    )
    _workload(compare)
    _own_command(compare)
    compare.add_argument(
        "--loaders",
        type=_kinds,
        default=DEFAULT,
        help=f"comma-separated, baseline first, from: {', '.join(NAMES)} (default: torch,cached)",
    )
    compare.add_argument(
        "--jobs",
        type=types.positive_int,
        metavar="N",
        help="N >= 2: run N jobs at once per loader (ours sharing prepared batches), not the three runs",
    )


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("simulate", help="hit rate and storage bytes per epoch of cache policies, no data")
    sim.add_argument("--dataset", type=types.size, required=True, help="dataset size, e.g. 140G")
    sim.add_argument("--cache", type=types.size, required=True, help="cache size per node, e.g. 64G")
    sim.add_argument("--record-size", type=types.size, default=112_000, help="bytes per record")
    sim.add_argument("--page-size", type=types.size, default=PAGE, help="bytes the device reads at least")
    sim.add_argument("--epochs", type=types.positive_int, default=3)
    sim.add_argument("--nodes", type=types.positive_int, default=1)
    sim.add_argument("--policy", choices=("all", "lru", "minio", "minio-partitioned"), default="all")
    sim.add_argument("--seed", type=int, default=0)
    _outputs(sim)


# a network filesystem: reading what half a cache misses takes about a decode; memory: the cache budget plus
# the job's measured memory, the same rule for both loaders
DEMO_LIMITS = Limits(storage_bandwidth=75_000_000, memory_limit=AUTO)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="generate a JPEG dataset and compare torch's DataLoader with ours")
    demo.add_argument(
        "--data-dir", type=types.data_dir, default=Path("stallbench-data"), help="where images are made"
    )
    demo.add_argument("--epochs", type=types.positive_int, default=3)
    demo.add_argument("--workers", type=types.positive_int, default=2)
    demo.add_argument("--batch-size", type=types.positive_int, default=64)
    demo.add_argument("--num-images", type=types.positive_int, default=None, help=argparse.SUPPRESS)
    _limits(demo, DEMO_LIMITS)
    _outputs(demo)
    demo.set_defaults(plot=Path("stallbench-demo.png"))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stallbench", description="Measure where a training job waits for data."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_analysis(sub)
    _add_simulate(sub)
    _add_demo(sub)
    return parser


def _check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        parser.error(f"--plot must name a .png file, got {str(args.plot)!r}")
    for path in (args.json, args.plot):
        if path is not None and not path.resolve().parent.is_dir():
            parser.error(f"no folder to write {str(path)!r} into")


def _check_target(parser: argparse.ArgumentParser, args: argparse.Namespace, target: type[Target]) -> None:
    """A usage error for an option given that ``target`` does not honour (``Target.refuses``), naming it and
    why; an option left at its default is not given."""
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices[args.command]._actions:
        if action.dest in target.refuses and _given(args, action):
            why = target.refuses[action.dest]
            parser.error(f"{action.option_strings[0]} does not act on {target.name}: {why}")


def _given(args: argparse.Namespace, action: argparse.Action) -> bool:
    """Whether the option of ``action`` was given (a limit: resolved into ``args.limits``)."""
    if isinstance(action, _Limit):
        return getattr(args.limits, action.dest) is not None
    return getattr(args, action.dest, action.default) != action.default


def _target(parser: argparse.ArgumentParser, args: argparse.Namespace, command: list[str]) -> type[Target]:
    """What ``analyze`` or ``compare`` runs: ``compare --jobs N`` (N >= 2), the command after ``--``, or a
    generated workload."""
    jobs = getattr(args, "jobs", None)
    if jobs is not None and command:
        parser.error("--jobs runs copies of a generated workload and takes no command after --")
    if jobs is not None and jobs >= 2:
        from stallbench.cli.jobs import Concurrent

        return Concurrent
    return Command if command else Generated


def main(argv: Sequence[str] | None = None) -> int:
    with stops_as_ctrl_c():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = make_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    own, command = split_command(argv)
    args = parser.parse_args(_negative_values_joined(own))
    _check_outputs(parser, args)
    if "--" in argv and not command:
        parser.error("nothing after --: give the command to run, e.g. -- python train.py")
    if command and shutil.which(command[0]) is None:
        parser.error(f"the command after -- was not found or is not executable: {command[0]!r}")
    if command and args.command not in ("analyze", "compare"):
        parser.error(f"{args.command} takes no command after --")
    if getattr(args, "max_len", None) is not None and args.packing is None:
        parser.error("--max-len is the pack length of --packing: give --packing too")
    if command and getattr(args, "packing", None) is not None:
        parser.error("--packing packs a generated workload's batches and takes no command after --")
    if args.command in ("analyze", "compare"):
        target = _target(parser, args, command)  # --jobs with a command is named first
        _check_target(parser, args, target)
        if target is not Generated:
            made = target(command) if target is Command else target()
            return _interruptible(functools.partial(run_target, target=made), args)
    if args.command == "analyze" and args.loader is None:
        args.loader = CACHED
    commands = {"analyze": run_analysis, "compare": run_analysis, "simulate": run_simulate, "demo": run_demo}
    return _interruptible(commands[args.command], args)


def _negative_values_joined(argv: list[str]) -> list[str]:
    """``--cache -5G`` as ``--cache=-5G``: argparse takes a value that starts with a minus for an option and
    says only "expected one argument"; joined, the option's own parser names the value. No option of ours
    starts with a minus and a digit."""
    joined: list[str] = []
    for token in argv:
        if joined and re.match(r"-\.?\d", token) and joined[-1].startswith("--") and "=" not in joined[-1]:
            joined[-1] += f"={token}"
        else:
            joined.append(token)
    return joined


def _interruptible(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return command(args)
    except KeyboardInterrupt as stop:  # before a command's own handler (e.g. while the demo imports torch)
        return say_stopped(args.command, stop, False)
