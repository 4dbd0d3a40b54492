"""``stallbench demo``: PyTorch's DataLoader and ours, side by side, on generated images and the same budget.

It generates the embedded default dataset (6,000 JPEGs of ~112 KB) if absent and runs ``compare`` on it:
each loader gets half the dataset as its memory budget (ours as its cache, torch's as page cache) and, where
root and cgroup v1 allow it, storage throttled by the kernel to the speed of a network filesystem, so the
fetch stall shows (the demo's default limits, ``cli.DEMO_LIMITS``, which its options change). Elsewhere it
says plainly that it could not, and runs at the disk's own speed.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from stallbench._grid import plain_table
from stallbench.analysis.request import AnalysisRequest, CacheSpec, NamedWorkload
from stallbench.analysis.results import LoaderReport
from stallbench.conditions.cgroup import StorageConditionUnavailable
from stallbench.conditions.limits import NONE
from stallbench.jobs.kinds import DEFAULT, KINDS

__all__ = ["concurrent_hint", "demo_request", "describe", "epoch_table"]

MB = 1e6


def demo_request(args: argparse.Namespace) -> tuple[AnalysisRequest, tuple[str, ...]]:
    """The compare the demo runs: storage throttled and memory limited where the machine allows it."""
    args.data_dir.mkdir(parents=True, exist_ok=True)
    limits = args.limits
    try:
        limits.check(args.data_dir, cold=True)
    except StorageConditionUnavailable as e:
        limits = NONE
        print(f"storage is NOT throttled and memory is NOT limited ({e})", flush=True)
    req = AnalysisRequest(
        data=NamedWorkload("images", args.num_images),
        data_dir=args.data_dir,
        workers=args.workers,
        batch_size=args.batch_size,
        compute="emulated:10",
        cache=CacheSpec(0.5),
        limits=limits,
        epochs=args.epochs,
    )
    return req, DEFAULT


def describe(req: AnalysisRequest, out=sys.stdout) -> None:
    import loader

    build = loader.pil_build()
    print(f"PIL build: {build.distribution} {build.version} (JPEG: {build.jpeg})", file=out)
    limits = req.limits.said(unset=False)
    if limits:
        print(f"both loaders run in a cgroup: {', '.join(limits)}", file=out)
    print(
        f"comparing {' and '.join(KINDS[k].label for k in DEFAULT)}: {req.epochs} epochs per run ...",
        file=out,
        flush=True,
    )


def concurrent_hint(req: AnalysisRequest) -> str:
    """The next step for many jobs at once: the demo runs one job per loader, a hyper-parameter search runs
    several on the same data, and ours share their prepared batches (``compare --jobs``)."""
    command = f"stallbench compare --jobs 3 --data {req.data}"
    if req.data_dir != Path("stallbench-data"):
        command += f" --data-dir {shlex.quote(str(req.data_dir))}"
    return (
        f"several jobs at once, as in a hyper-parameter search? Ours share each prepared batch:\n  {command}"
    )


def epoch_table(reports: Sequence[LoaderReport]) -> str:
    """Cold runs, epoch by epoch: seconds and storage MB of each loader side by side."""
    cold = {r.loader: next(run for run in r.runs if run.phase == "cold").epochs for r in reports}
    headers = ["epoch"] + [f"{k} {col}" for k in cold for col in ("s", "storage MB")]
    rows = []
    for epochs in zip(*cold.values(), strict=True):
        rows.append([epochs[0].epoch, *[v for e in epochs for v in (e.seconds, e.storage_bytes / MB)]])
    return plain_table(headers, rows)
