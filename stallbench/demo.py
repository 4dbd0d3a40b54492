"""``stallbench demo``: PyTorch's DataLoader and ours, side by side, on generated images and the same budget.

It generates the embedded default dataset (6,000 JPEGs of ~112 KB) if absent and runs ``compare`` on it:
each loader gets half the dataset as its memory budget (ours as its cache, torch's as page cache) and, where
root and cgroup v1 allow it, storage throttled by the kernel to the speed of a network filesystem, so the
fetch stall shows. Elsewhere it says plainly that it could not, and runs at the disk's own speed.
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
from stallbench.conditions.storage import probe_storage_conditions
from stallbench.jobs.kinds import KINDS, NAMES

__all__ = ["DEMO_BPS", "concurrent_hint", "demo_request", "describe", "epoch_table"]

DEMO_BPS = 75_000_000  # a network filesystem: reading what half a cache misses takes about a decode
_NEEDED = ("memory_limit", "storage_bandwidth", "page_cache_eviction")
MB = 1e6


def demo_request(args: argparse.Namespace) -> tuple[AnalysisRequest, tuple[str, ...]]:
    """The compare the demo runs: storage throttled and memory limited where the machine allows it."""
    args.data_dir.mkdir(parents=True, exist_ok=True)
    problems = probe_storage_conditions(args.data_dir)
    limited = all(problems[k] is None for k in _NEEDED)
    req = AnalysisRequest(
        data=NamedWorkload("images", args.num_images),
        data_dir=args.data_dir, workers=args.workers, batch_size=args.batch_size, compute="emulated:10",
        cache=CacheSpec(0.5), storage_bandwidth=DEMO_BPS if limited else None,
        memory_limit="auto" if limited else None, epochs=args.epochs,
    )  # fmt: skip
    if not limited:
        reasons = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in problems.items() if v)
        print(f"storage is NOT throttled and memory is NOT limited ({reasons})", flush=True)
    return req, NAMES


def describe(req: AnalysisRequest, out=sys.stdout) -> None:
    import loader

    build = loader.pil_build()
    print(f"PIL build: {build.distribution} {build.version} (JPEG: {build.jpeg})", file=out)
    if req.storage_bandwidth:
        print(
            f"both loaders run in a cgroup: storage reads throttled to "
            f"{req.storage_bandwidth / MB:.0f} MB/s, "
            "memory limited to the same budget (half the data + the job's measured memory + the memory the "
            "cached loader keeps free)",
            file=out,
        )
    print(
        f"comparing {' and '.join(k.label for k in KINDS.values())}: {req.epochs} epochs per run ...",
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
