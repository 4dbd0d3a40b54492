"""One loader's epochs over an image folder, as a job: a JSON line per epoch on stdout.

Run as ``python -m stallbench._epochs --loader torch|cached --data DIR ...`` (the demo does, inside a cgroup
when it can) or through ``job_main(argv, transform=...)`` from a script that brings its own transform. Storage
bytes are the kernel's count (``/proc/<pid>/io`` ``read_bytes``) summed over the job and its workers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

import psutil
import torch

__all__ = ["LOADERS", "job_main", "run_epochs", "storage_read_bytes"]

LOADERS = ("torch", "cached")
_STAT_DELTAS = ("hits", "misses", "bytes_from_cache", "bytes_from_storage", "records_admitted")


def storage_read_bytes() -> int:
    """Bytes the kernel read from storage for this process and all its live descendants."""
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.io_counters().read_bytes
        except psutil.NoSuchProcess:
            continue
    return total


def _make_loader(args: argparse.Namespace, transform: Any) -> torch.utils.data.DataLoader:
    import loader  # imported here: `python -m stallbench --help` need not load torch's data stack

    dataset = loader.ImageFolder(args.data, transform=transform)
    common = dict(
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(args.seed),
    )
    if args.loader == "torch":
        return torch.utils.data.DataLoader(dataset, **common)
    return loader.DataLoader(dataset, cache_bytes=args.cache_bytes, cache_dir=args.cache_dir, **common)


def _stat_values(dl: torch.utils.data.DataLoader) -> dict[str, float]:
    stats = asdict(dl.stats()) if hasattr(dl, "stats") else {}
    return {k: stats[k] for k in (*_STAT_DELTAS, "cache_bytes_used") if k in stats}


def run_epochs(
    dl: torch.utils.data.DataLoader, epochs: int, max_batches: int | None = None
) -> Iterator[dict[str, Any]]:
    """Iterate ``dl`` for ``epochs`` epochs; per epoch: seconds, batches, storage bytes, stats deltas."""
    for epoch in range(1, epochs + 1):
        before_stats, before_io = _stat_values(dl), storage_read_bytes()
        start, batches = time.perf_counter(), 0
        for _ in dl:
            batches += 1
            if batches == max_batches:
                break
        record = {"epoch": epoch, "seconds": time.perf_counter() - start, "batches": batches}
        record["storage_bytes"] = storage_read_bytes() - before_io
        after = _stat_values(dl)
        record.update({k: after[k] - before_stats[k] for k in _STAT_DELTAS if k in after})
        if "hits" in after:
            reads = record["hits"] + record["misses"]
            record["hit_rate"] = record["hits"] / reads if reads else 0.0
            record["cache_bytes_used"] = after["cache_bytes_used"]
        yield record


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loader", choices=LOADERS, required=True)
    parser.add_argument("--data", required=True, help="image folder (root/<class>/<image>)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cache-bytes", type=int, default=None, help="cache capacity (cached loader)")
    parser.add_argument("--cache-dir", default="/dev/shm")
    parser.add_argument("--transform", choices=("train", "eval", "none"), default="train")
    parser.add_argument("--max-batches", type=int, default=None, help="stop each epoch after this many")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def job_main(argv: Sequence[str] | None = None, transform: Callable[[bytes], Any] | None = None) -> int:
    """Run the job; ``transform`` overrides ``--transform``. Prints one JSON object per epoch."""
    args = _parser().parse_args(argv)
    if transform is None and args.transform != "none":
        transform = args.transform
    dl = _make_loader(args, transform)
    for record in run_epochs(dl, args.epochs, args.max_batches):
        print(json.dumps({"loader": args.loader, **record}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(job_main())
