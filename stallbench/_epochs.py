"""One loader's epochs as a job: a JSON line per epoch on stdout.

Run as ``python -m stallbench._epochs --loader torch|cached --data PATH ...`` (the demo and the analysis do,
inside a cgroup when they can) or through ``job_main(argv, transform=...)`` from a script that brings its
own transform. Each batch goes through the compute model (``--compute``); ``--mode ingestion`` takes one
batch and then only runs the step, the differential method's first run. Storage bytes are the kernel's count
(``/proc/<pid>/io`` ``read_bytes``, device bytes: whole pages) summed over the job and its workers; both
loaders are instrumented the same way (stage times come from the dataset and a timed collate in either
loader).

The step is measured the same way in every run: it runs from a batch's arrival to the next ``__next__``, and
that includes freeing the previous batch (the loop variable lets go of it), which for a batch a worker sent
through shared memory unmaps and releases it. So the ingestion run hands out its batch through as many
workers as the real loader has, a fresh copy each time: its steps free a shared-memory batch as the prep and
cold runs' steps do, and that cost counts as compute in all three, not as a stall.
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

from stallbench._jobdata import make_dataset_and_loader
from stallbench.compute import ComputeStep, parse_compute
from stallbench.profile import profile

__all__ = ["LOADERS", "ingestion_loader", "job_main", "run_epochs", "storage_read_bytes"]

LOADERS = ("torch", "cached")
_STAT_DELTAS = ("hits", "misses", "bytes_from_cache", "records_admitted", "fetch_seconds", "decode_seconds")
_STAT_DELTAS += ("collate_seconds",)


def _tree() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def storage_read_bytes() -> int:
    """Bytes the kernel read from storage for this process and all its live descendants."""
    return sum(_each(lambda p: p.io_counters().read_bytes))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and all its live descendants."""
    return sum(_each(lambda p: sum(p.cpu_times()[:2])))


def _each(read: Callable[[psutil.Process], float]) -> Iterator[float]:
    for proc in _tree():
        try:
            yield read(proc)
        except psutil.NoSuchProcess:
            continue


class _Replay(torch.utils.data.Dataset):
    """One batch, ``times`` times: in a worker a fresh copy each time, so it travels as a real batch does."""

    def __init__(self, batch: Any, times: int) -> None:
        self.batch, self.times = batch, times

    def __len__(self) -> int:
        return self.times

    def __getitem__(self, index: int) -> Any:
        return _fresh(self.batch) if torch.utils.data.get_worker_info() is not None else self.batch


def _fresh(batch: Any) -> Any:
    """A copy of every tensor in ``batch`` (nested in lists, tuples and dicts); other values as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, dict):
        return {key: _fresh(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_fresh(value) for value in batch)
    return batch


def ingestion_loader(dl: Any, workers: int, max_batches: int | None = None) -> torch.utils.data.DataLoader:
    """The ingestion run's loader: ``dl``'s first batch, as many times as ``dl`` has batches, handed out by
    ``workers`` workers through shared memory (see the module docstring); with none, the batch itself."""
    times = min(len(dl), max_batches or len(dl))
    replay = _Replay(next(iter(dl)), times)
    return torch.utils.data.DataLoader(
        replay, batch_size=None, num_workers=workers, persistent_workers=workers > 0
    )


def _samples(batch: Any) -> int:
    if isinstance(batch, (list, tuple)) and len(batch) == 2 and hasattr(batch[1], "__len__"):
        return len(batch[1])
    return 1


def run_epochs(
    dl: Any,
    epochs: int,
    max_batches: int | None = None,
    step: ComputeStep | None = None,
    stats: Callable[[], Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Iterate ``dl`` for ``epochs`` epochs, ``step`` on each batch; per epoch: times, bytes, stats deltas."""
    prof = profile(dl)
    for epoch in range(1, epochs + 1):
        before = (_stat_values(stats), storage_read_bytes(), cpu_seconds())
        start, batches, samples = time.perf_counter(), 0, 0
        for batch in prof:
            if step is not None:
                step(batch)
            batches, samples = batches + 1, samples + _samples(batch)
            if batches == max_batches:
                break
        seconds = time.perf_counter() - start
        record = {"epoch": epoch, "seconds": seconds, "batches": batches, "samples": samples}
        record.update(_profile_fields(prof, last=epoch == epochs))
        record["storage_bytes"] = storage_read_bytes() - before[1]
        record["cpu_seconds"] = cpu_seconds() - before[2]
        after = _stat_values(stats)
        record.update({k: after[k] - before[0][k] for k in _STAT_DELTAS if k in after})
        if "hits" in record:
            reads = record["hits"] + record["misses"]
            record["hit_rate"] = record["hits"] / reads if reads else 0.0
            record.update(
                {
                    k: after[k]
                    for k in ("cache_bytes_used", "cache_capacity", "records_cached", "memory_pauses")
                }
            )
        yield record


def _profile_fields(prof: Any, last: bool) -> dict[str, Any]:
    row = prof.to_dict()["epochs"][-1]
    fields = {
        "wait_seconds": row["wait_s"],  # the first batch's wait included
        "step_seconds": row["step_s"],
        "first_batch_seconds": row["first_batch_s"] or 0.0,
    }
    if last:
        tl = prof.timeline()
        mine = tl.epoch == tl.epoch.max()
        pairs = zip(tl.wait_s[mine], tl.step_s[mine], strict=True)
        fields["timeline"] = [[float(wait), float(step)] for wait, step in pairs]
    return fields


def _stat_values(stats: Callable[[], Any] | None) -> dict[str, float]:
    return asdict(stats()) if stats is not None else {}


def _cache_bytes(text: str) -> int | str:
    return text if text == "auto" else int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loader", choices=LOADERS, required=True)
    parser.add_argument("--data", required=True, help="image folder, LMDB folder, or Arrow/Parquet file")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--cache-bytes",
        type=_cache_bytes,
        default=None,
        help="cache capacity in bytes or 'auto' (cached loader)",
    )
    parser.add_argument("--cache-dir", default="/dev/shm")
    parser.add_argument("--transform", choices=("train", "eval", "none"), default="train")
    parser.add_argument("--compute", default=None, help="compute model per batch, e.g. emulated:20")
    parser.add_argument("--mode", choices=("pipeline", "ingestion"), default="pipeline")
    parser.add_argument("--max-batches", type=int, default=None, help="stop each epoch after this many")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def job_main(argv: Sequence[str] | None = None, transform: Callable[[bytes], Any] | None = None) -> int:
    """Run the job; ``transform`` overrides ``--transform``. Prints one JSON object per epoch."""
    args = _parser().parse_args(argv)
    if transform is None and args.transform != "none":
        transform = args.transform
    torch.manual_seed(args.seed)
    dl, stats = make_dataset_and_loader(args, transform)
    step = parse_compute(args.compute) if args.compute else None
    if args.mode == "ingestion":
        dl, stats = ingestion_loader(dl, args.workers, args.max_batches), None
    for record in run_epochs(dl, args.epochs, args.max_batches, step, stats):
        print(json.dumps({"loader": args.loader, **record}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(job_main())
