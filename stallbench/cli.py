"""The ``stallbench`` command line: argparse subcommands (for now ``demo``).

Exit codes: 0 success, 1 failure, 2 usage error (argparse), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from stallbench.demo import DemoOptions, run_demo

__all__ = ["main", "make_parser"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def _add_demo(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="torch's DataLoader vs loader.DataLoader on generated images, side by side",
        description="Run the same epochs with torch.utils.data.DataLoader and loader.DataLoader over "
        "generated JPEGs, with a cold page cache and (where cgroups allow) the same memory budget and "
        "throttled storage, and print time and storage bytes per epoch side by side.",
    )
    demo.add_argument("--data-dir", type=Path, default=Path("stallbench-data"), help="where images are made")
    demo.add_argument("--epochs", type=_positive_int, default=3)
    demo.add_argument("--workers", type=_positive_int, default=2, help="DataLoader workers")
    demo.add_argument("--batch-size", type=_positive_int, default=64)
    demo.add_argument(
        "--cache-fraction", type=_fraction, default=0.5, help="memory budget as a fraction of the data"
    )
    demo.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON to FILE")
    demo.add_argument("--num-images", type=_positive_int, default=None, help=argparse.SUPPRESS)  # for tests


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stallbench", description="Measure where a training job waits for its data."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo(subparsers)
    return parser


def _demo(args: argparse.Namespace) -> int:
    opts = DemoOptions(
        data_dir=args.data_dir,
        epochs=args.epochs,
        workers=args.workers,
        batch_size=args.batch_size,
        cache_fraction=args.cache_fraction,
        num_images=args.num_images,
    )
    report = run_demo(opts)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return _demo(args)
    except KeyboardInterrupt:
        print("stallbench: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"stallbench {args.command}: error: {exc}", file=sys.stderr)
        return 1
