"""A generated job, the child side: one loader kind's epochs, a JSON line per epoch on stdout.

Run as ``python -m stallbench.jobs.workload JOB.json`` (the demo and the analysis do, inside a cgroup when
they can: ``stallbench.jobs.run.run_workload``) or as a script that calls ``main(transform=...)`` with a
transform of its own; ``JOB.json`` holds a :class:`~stallbench.jobs.spec.WorkloadJob`. Each batch goes
through the compute model (``compute``); ``mode="ingestion"`` takes one batch and then only runs the step,
the differential method's first run (token data: every batch in its real shape, made of zeros, so that a
step whose cost follows the tokens costs what it does on the real ones). Storage bytes and CPU seconds are
the process tree's (``loader.system.counters``: the job and its workers; for data in object storage,
which the kernel's count does not see, the bytes its source fetched: ``data.read_bytes_counter``); every
loader kind is instrumented the same way (stage times come from the dataset and a timed collate in either
loader). Each epoch's ``start_time`` and ``end_time`` are read from ``time.monotonic()``, one clock for every
process of the machine, so jobs run at once can be lined up (``compare --jobs``); a loader in a group adds
its ``coordination`` figures.

The step is measured the same way in every run: it runs from a batch's arrival to the next ``__next__``, and
that includes freeing the previous batch (the loop variable lets go of it), which for a batch a worker sent
through shared memory unmaps and releases it. So the ingestion run hands out its batch through as many
workers as the real loader has, a fresh copy each time: its steps free a shared-memory batch as the prep and
cold runs' steps do, and that cost counts as compute in all three, not as a stall.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

import torch

from stallbench.batches import batch_samples, batch_tokens
from stallbench.compute import ComputeStep, parse_compute
from stallbench.energy import open_meter
from stallbench.jobs._fresh import fresh_copy
from stallbench.jobs.batching import SeenIndices
from stallbench.jobs.counters import cpu_seconds, storage_read_bytes
from stallbench.jobs.data import make_loader, read_bytes_counter, shapes_loader, token_lengths
from stallbench.jobs.spec import CACHE_FORM_FIELDS, WorkloadJob
from stallbench.profile import profile

__all__ = ["ingestion_loader", "main", "run_epochs"]

_STAT_DELTAS = ("hits", "misses", "bytes_from_cache", "records_admitted", "fetch_seconds", "decode_seconds")
_STAT_DELTAS += ("collate_seconds",)
_STAT_NOW = ("cache_bytes_used", "cache_capacity", "records_cached", "memory_pauses", *CACHE_FORM_FIELDS)


class _Replay(torch.utils.data.Dataset):
    """One batch, ``times`` times: in a worker a fresh copy each time, so it travels as a real batch does."""

    def __init__(self, batch: Any, times: int) -> None:
        self.batch, self.times = batch, times

    def __len__(self) -> int:
        return self.times

    def __getitem__(self, index: int) -> Any:
        return fresh_copy(self.batch) if torch.utils.data.get_worker_info() is not None else self.batch


def ingestion_loader(dl: Any, workers: int, max_batches: int | None = None) -> torch.utils.data.DataLoader:
    """The ingestion run's loader: ``dl``'s first batch, as many times as ``dl`` has batches, handed out by
    ``workers`` workers through shared memory (see the module docstring); with none, the batch itself."""
    times = min(len(dl), max_batches or len(dl))
    replay = _Replay(next(iter(dl)), times)
    return torch.utils.data.DataLoader(
        replay, batch_size=None, num_workers=workers, persistent_workers=workers > 0
    )


def _loop(
    prof: Any, step: ComputeStep | None, max_batches: int | None, room: int | None
) -> tuple[dict[str, Any], float]:
    """One epoch of ``prof``: its batches, samples, and a token batch's valid tokens and token slots (a pack's
    ``room``); and the clock at its end, read before a ``break`` shuts the workers down (a script's epoch ends
    there too)."""
    batches, samples, valid, slots = 0, 0, 0, 0
    for batch in prof:
        if step is not None:
            step(batch)
        tokens = batch_tokens(batch, room)
        batches, samples = batches + 1, samples + batch_samples(batch)
        valid, slots = valid + (tokens.valid if tokens else 0), slots + (tokens.slots if tokens else 0)
        if batches == max_batches:
            end = time.perf_counter()
            break
    else:
        end = time.perf_counter()
    tokens = {"valid_tokens": valid or None, "token_slots": slots or None}  # None: no token batch
    return {"batches": batches, "samples": samples, **tokens}, end


def run_epochs(
    dl: Any,
    epochs: int,
    max_batches: int | None = None,
    step: ComputeStep | None = None,
    stats: Callable[[], Any] | None = None,
    read_bytes: Callable[[], int] = storage_read_bytes,
) -> Iterator[dict[str, Any]]:
    """Iterate ``dl`` for ``epochs`` epochs, ``step`` on each batch; per epoch: times, bytes, stats deltas,
    the useful work (``stallbench.batches``; unique examples where the loader counts them) and the energy
    where a counter is readable (``stallbench.energy``); storage bytes as ``read_bytes`` counts them."""
    prof, meter = profile(dl), open_meter()
    for epoch in range(1, epochs + 1):
        before = (_stat_values(stats), read_bytes(), cpu_seconds(), meter.joules() if meter else None)
        start_time, start = time.monotonic(), time.perf_counter()
        counts, end = _loop(prof, step, max_batches, _pack_room(dl))
        record = {"epoch": epoch, "seconds": end - start, **counts}
        record.update(start_time=start_time, end_time=time.monotonic())
        record.update(_profile_fields(prof, last=epoch == epochs))
        record["storage_bytes"] = read_bytes() - before[1]
        record["cpu_seconds"] = cpu_seconds() - before[2]
        seen = getattr(dl, "batch_sampler", None)
        record["unique_samples"] = seen.unique if isinstance(seen, SeenIndices) else None
        record["energy_joules"] = meter.joules() - before[3] if meter else None
        record["energy_source"] = meter.source if meter else None
        after = _stat_values(stats)
        record.update({k: after[k] - before[0][k] for k in _STAT_DELTAS if k in after})
        if after.get("coordination") is not None:
            record["coordination"] = after["coordination"]  # the job's totals so far, not the epoch's
        if "hits" in record:
            reads = record["hits"] + record["misses"]
            record["hit_rate"] = record["hits"] / reads if reads else 0.0
            record.update({k: after[k] for k in _STAT_NOW})
        yield record


def _pack_room(dl: Any) -> int | None:
    """The tokens a packed step was packed into (its collator's ``max_len``, inside our loader's timing
    wrapper where there is one); None for other batches."""
    collate = getattr(dl, "collate_fn", None)
    collate = getattr(collate, "collate_fn", collate)
    return getattr(collate, "max_len", None) if type(collate).__name__ == "PackingCollator" else None


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


def _loader(job: WorkloadJob, transform: Callable[[bytes], Any] | None) -> tuple[Any, Any]:
    """The job's loader and its stats; in the ingestion run, batches that need no data: token batches of
    the real shapes made of zeros (their step cost follows their shapes), any other the first one replayed."""
    if job.mode != "ingestion":
        return make_loader(job, transform)
    lengths = token_lengths(job.data)
    if lengths is not None:
        return shapes_loader(lengths, job), None
    dl, _ = make_loader(job, transform)
    return ingestion_loader(dl, job.workers, job.max_batches), None


def main(
    argv: Sequence[str] | None = None,
    transform: Callable[[bytes], Any] | None = None,
    step: Callable[[Any], None] | None = None,
) -> int:
    """Run the job whose JSON file ``argv`` names (default: this process's arguments); ``transform`` and
    ``step`` (the training step per batch) override the job's. Prints one JSON object per epoch."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        sys.exit("usage: python -m stallbench.jobs.workload JOB.json (a WorkloadJob as JSON)")
    job = WorkloadJob.read(args[0])
    if transform is None and job.transform != "none":
        transform = job.transform
    torch.manual_seed(job.seed)
    if step is None and job.compute:
        step = parse_compute(job.compute)
    dl, stats = _loader(job, transform)
    for record in run_epochs(
        dl, job.epochs, job.max_batches, step, stats, read_bytes_counter(job.data, stats)
    ):
        print(json.dumps({"loader": job.loader, **record}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
