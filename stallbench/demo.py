"""``stallbench demo``: PyTorch's DataLoader and ours, side by side, on the same images and the same budget.

Each loader runs the same epochs in its own process (decode + train augmentation), after the images are
evicted from the page cache. Where root and cgroup v1 allow it, both run in a cgroup that throttles storage
reads to 200 MB/s and limits memory to the cache budget plus the job's measured overhead, so torch's loader
gets the budget as page cache and ours as its cache; elsewhere the output says plainly that it could not.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from stallbench._jobs import (
    job_argv,
    measure_overhead,
    memory_limit,
    probe_cache_bytes,
    run_job,
    scratch_cache_dir,
)
from stallbench.storage import StorageLimits, evict_page_cache, probe_storage_conditions
from stallbench.workloads import (
    DEFAULT_IMAGE_COUNT,
    DEFAULT_RECORD_BYTES,
    MANIFEST_NAME,
    default_image_workload,
    make_jpeg_folder,
)

__all__ = ["KINDS", "READ_BPS", "DemoOptions", "Plan", "format_table", "run_demo"]

KINDS = {"torch": "torch.utils.data.DataLoader", "cached": "loader.DataLoader"}
READ_BPS = 200_000_000
_PROBE_BATCHES = 2
_NEEDED = ("memory_limit", "read_throttle")
MB = 1e6


@dataclass(frozen=True)
class DemoOptions:
    data_dir: Path = Path("stallbench-data")
    epochs: int = 3
    workers: int = 2
    batch_size: int = 64
    cache_fraction: float = 0.5
    num_images: int | None = None  # None: the default workload (1,500 images)


@dataclass
class Plan:
    """What both loaders get: the data, the cache budget, and the kernel's limits when it can set them."""

    data: Path
    records: int
    dataset_bytes: int
    cache_bytes: int
    memory_limit: int | None = None
    overheads: dict[str, int] = field(default_factory=dict)
    not_limited: str | None = None  # why storage is not throttled, when it is not


def _prepare_data(opts: DemoOptions, say: Callable[[str], None]) -> Path:
    n = opts.num_images or DEFAULT_IMAGE_COUNT
    root = opts.data_dir / f"images-{n}"
    if not (root / MANIFEST_NAME).exists():
        say(f"generating {n} JPEG images of {DEFAULT_RECORD_BYTES // 1000} KB in {root} ...")
    if opts.num_images is None:
        return default_image_workload(opts.data_dir)
    return make_jpeg_folder(root, num_images=n, num_classes=min(10, n), record_bytes=DEFAULT_RECORD_BYTES)


def _argv(plan: Plan, opts: DemoOptions, kind: str, cache_dir: Path, **override: int) -> list[str]:
    options = dict(epochs=opts.epochs, workers=opts.workers, batch_size=opts.batch_size, transform="train")
    if kind == "cached":
        options.update(cache_bytes=plan.cache_bytes, cache_dir=cache_dir)
    return job_argv(kind, plan.data, **{**options, **override})


def _plan(opts: DemoOptions, data: Path) -> Plan:
    from loader.sources import ImageFolderSource

    source = ImageFolderSource(data)
    plan = Plan(data, len(source), source.nbytes, int(opts.cache_fraction * source.nbytes))
    problems = probe_storage_conditions(data)
    reasons = [f"{k.replace('_', ' ')}: {v}" for k, v in problems.items() if v and k in _NEEDED]
    if reasons:
        plan.not_limited = "; ".join(reasons)
        return plan
    probe = dict(epochs=1, max_batches=_PROBE_BATCHES, cache_bytes=probe_cache_bytes(plan.records))
    plan.overheads = measure_overhead(lambda kind, d: _argv(plan, opts, kind, d, **probe), list(KINDS), data)
    plan.memory_limit = memory_limit(plan.cache_bytes, plan.overheads)
    return plan


def _run_loader(plan: Plan, opts: DemoOptions, kind: str) -> list[dict]:
    cache_dir = scratch_cache_dir()
    try:
        evict_page_cache(plan.data)
        argv = _argv(plan, opts, kind, cache_dir)
        if plan.memory_limit is None:
            return run_job(argv)
        limits = StorageLimits(memory_bytes=plan.memory_limit, read_bps=READ_BPS, device_path=plan.data)
        with limits:
            return run_job(argv, limits)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def format_table(headers: list[str], rows: list[list[object]]) -> str:
    """A plain text table, columns right-aligned, floats with two decimals."""
    cells = [headers] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _table(results: dict[str, list[dict]]) -> str:
    headers = ["epoch", "torch s", "torch storage MB", "ours s", "ours storage MB", "ours hit rate"]
    rows = []
    for t, o in zip(results["torch"], results["cached"], strict=True):
        mb = (t["storage_bytes"] / MB, o["storage_bytes"] / MB)
        rows.append([t["epoch"], t["seconds"], mb[0], o["seconds"], mb[1], o["hit_rate"]])
    return format_table(headers, rows)


def _describe(plan: Plan, say: Callable[[str], None]) -> None:
    say(f"data: {plan.data} ({plan.records} images, {plan.dataset_bytes / MB:.0f} MB)")
    share = plan.cache_bytes / plan.dataset_bytes
    say(f"cache budget: {plan.cache_bytes / MB:.0f} MB ({share:.0%} of the data)")
    if plan.memory_limit is None:
        say(
            f"storage is NOT throttled and memory is NOT limited ({plan.not_limited}); reads run at this "
            "disk's full speed, and the OS page cache may keep the whole dataset for torch's loader"
        )
        return
    overhead = max(plan.overheads.values())
    margin = plan.memory_limit - plan.cache_bytes - overhead
    say(
        f"both loaders run in a cgroup: storage reads throttled to {READ_BPS / MB:.0f} MB/s, memory "
        f"limited to {plan.memory_limit / MB:.0f} MB (cache budget + {overhead / MB:.0f} MB measured "
        f"job overhead + {margin / MB:.0f} MB margin)"
    )


def run_demo(opts: DemoOptions, out: TextIO = sys.stdout) -> dict:
    """Run the demo, print the comparison to ``out``, and return it as a JSON-ready dict."""
    import loader

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    build = loader.pil_build()
    say(f"PIL build: {build.distribution} {build.version} (JPEG: {build.jpeg})")
    plan = _plan(opts, _prepare_data(opts, say))
    _describe(plan, say)
    results = {}
    for kind, name in KINDS.items():
        say(f"running {name}: {opts.epochs} epochs, {opts.workers} workers, batch size {opts.batch_size} ...")
        results[kind] = _run_loader(plan, opts, kind)
    say(_table(results))
    say("storage MB: what the kernel read from the disk for the loader's processes (/proc/<pid>/io)")
    report = {"pil_build": vars(build), **vars(plan), "read_bps": None if plan.not_limited else READ_BPS}
    return {**report, "data": str(plan.data), "loaders": results}
