"""What each subcommand does once its options are parsed; errors become exit codes with a clear message."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from stallbench.analysis.analyze import prepare
from stallbench.analysis.phases import RunPlan
from stallbench.analysis.request import AnalysisRequest
from stallbench.analysis.results import LoaderReport
from stallbench.conditions.cgroup import StorageConditionUnavailable

__all__ = [
    "Progress",
    "loader_kinds",
    "prepare_data",
    "report_outputs",
    "run_analysis",
    "run_demo",
    "run_simulate",
    "say_error",
]


def say_error(command: str, exc: BaseException) -> None:
    print(f"stallbench {command}: error: {exc}", file=sys.stderr)


def request_from(args: argparse.Namespace) -> AnalysisRequest:
    return AnalysisRequest(
        data=args.data,
        data_dir=args.data_dir,
        workers=args.workers,
        batch_size=args.batch_size,
        compute=args.compute,
        cache=args.cache,
        limits=args.limits,
        epochs=args.epochs,
        transform=args.transform,
        packing=args.packing,
        max_len=args.max_len,
    )


def loader_kinds(args: argparse.Namespace) -> tuple[str, ...]:
    """The loaders asked for: ``analyze``'s one, ``compare``'s in order."""
    return (args.loader,) if args.command == "analyze" else tuple(args.loaders)


def run_analysis(args: argparse.Namespace) -> int:
    """``analyze`` or ``compare`` of a generated workload (or data the options describe)."""
    from stallbench.cli.targets import Generated, run_target

    return run_target(args, Generated(request_from(args), loader_kinds(args)))


def prepare_data(
    args: argparse.Namespace, req: AnalysisRequest, kinds: Sequence[str], cold: bool = True
) -> RunPlan:
    """:func:`~stallbench.analysis.analyze.prepare`, with a progress bar while a workload is generated."""
    with Progress(args, "generating data", unit="image") as bar:
        return prepare(req, kinds, progress=bar.to, cold=cold)


def report_outputs(args: argparse.Namespace, reports: Sequence[LoaderReport], by_epoch: bool = False) -> None:
    """Print the table(s) and write the JSON and PNG, for whatever loaders are done."""
    if not reports:
        return
    from stallbench.demo import epoch_table
    from stallbench.report import format_report, write_json, write_plot

    if by_epoch:
        print("cold runs, epoch by epoch (storage MB: what the kernel read from the device):")
        print(epoch_table(reports) + "\n")
    print(format_report(reports))
    if args.json is not None:
        write_json(reports, args.json)
        print(f"JSON written to {args.json}")
    if args.plot is not None:
        write_plot(reports, args.plot)
        print(f"plot written to {args.plot}")


class Progress:
    """A tqdm bar on stderr (shown only for what lasts over a second), or nothing with --no-progress."""

    def __init__(self, args: argparse.Namespace, desc: str, unit: str, total: int | None = None) -> None:
        self._bar = None
        if not args.no_progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, delay=1.0)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()

    def step(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(label)
            self._bar.update(1)

    def to(self, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.total = total
            self._bar.update(done - self._bar.n)


def run_simulate(args: argparse.Namespace) -> int:
    from stallbench.simulate import format_simulation, simulate, simulate_all, simulation_to_json

    options = dict(
        dataset_bytes=args.dataset,
        cache_bytes=args.cache,
        record_bytes=args.record_size,
        epochs=args.epochs,
        nodes=args.nodes,
        seed=args.seed,
        page_bytes=args.page_size,
    )
    try:
        results = simulate_all(**options) if args.policy == "all" else (simulate(args.policy, **options),)
    except ValueError as exc:
        say_error("simulate", exc)
        return 2
    print(format_simulation(results))
    if args.json is not None:
        from stallbench._files import write_atomic

        write_atomic(args.json, json.dumps(simulation_to_json(results), indent=1).encode())
    if args.plot is not None:
        from stallbench._files import write_atomic
        from stallbench.report.plot import simulation_png_bytes

        write_atomic(args.plot, simulation_png_bytes(results))
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from stallbench.cli.targets import Generated, run_target
    from stallbench.demo import concurrent_hint, demo_request, describe

    try:
        req, kinds = demo_request(args)
    except (StorageConditionUnavailable, ValueError) as exc:
        say_error("demo", exc)
        return 2
    describe(req)
    code = run_target(args, Generated(req, kinds, by_epoch=True))
    if code == 0:
        print(concurrent_hint(req))
    return code
