"""What the measuring side (``stallbench.jobs.child``) knows of one DataLoader of the user's process, and the
LoaderEpoch line it writes for each of its epochs: one ``write`` on an append-only file per process, so a
kill leaves every earlier line readable."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from stallbench.jobs._sample_times import slowest
from stallbench.jobs._timed import Counters, EpochMeter, say
from stallbench.jobs.spec import LoaderEpoch, records_path

__all__ = [
    "LoaderState",
    "counting_sampler",
    "derives_from",
    "epoch_length",
    "epoch_record",
    "loader_settings",
    "loader_shape",
    "token_batches",
    "write_record",
]


@dataclasses.dataclass(eq=False)
class LoaderState:
    """What the run knows of one DataLoader of this process."""

    id: str
    order: int
    loader_class: str
    mode: str
    settings: dict[str, Any]  # the records' workers, batch_size, prefetch_factor and dataset_len
    stats: Callable[[], Any] | None  # loader.DataLoader.stats, or a generated job's ``stallbench_stats``
    serves_files: bool  # a loader.DataLoader with cache_files: its Dataset's own reads go through the cache
    counts_tokens: bool = False  # its batches are token batches whose padding is known (``token_batches``)
    room: int | None = None  # a packing collator's max_len: the tokens each pack was packed into
    seen: Any = None  # a batch sampler that counts the distinct indices of its latest pass (``unique``)
    over_network: bool = False  # its data is fetched over the network: storage bytes are what it fetched
    batches: int = 0  # over the epochs closed
    epochs: int = 0  # records written
    complete: int = 0  # epochs that ran to their end
    shape: tuple[Any, ...] = ()  # what a rebuilt loader must match to keep this id (``loader_shape``)
    dataset_id: int = 0  # id() of its latest loader's Dataset, alive while that loader is held
    open: EpochMeter | None = None
    replay: list[Any] | None = None
    ended: tuple[int, float] | None = None  # the transitions' reading, and the clock, at its latest end

    @property
    def total(self) -> int:
        return self.batches + (self.open.batches if self.open is not None else 0)


def epoch_record(
    state: LoaderState, meter: EpochMeter, complete: bool, end: float, after: Counters, out_dir: str
) -> LoaderEpoch:
    """The epoch ``meter`` timed, with the counters' change from its start to ``after`` and the slow samples
    its processes wrote down in ``out_dir`` meanwhile (``_sample_times``)."""
    before = meter.before
    stats = after.stats_since(before) if state.stats is not None else {}
    hits, misses = int(stats.get("hits", 0)), int(stats.get("misses", 0))
    storage = after.storage_bytes - before.storage_bytes
    if state.over_network:  # the kernel's count does not see sockets: what the source fetched
        storage = int(stats.get("bytes_from_source", 0))
    joules = None if before.joules is None or after.joules is None else after.joules - before.joules
    tokens = meter.token_slots > 0
    updates = None if after.optimizer_steps is None else after.optimizer_steps - (before.optimizer_steps or 0)
    end_time = meter.start_time + (end - meter.start)
    return LoaderEpoch(
        loader=state.id,
        rank=_rank(),
        pid=os.getpid(),
        epoch=state.epochs,
        seconds=end - meter.start,
        wait_seconds=meter.wait,
        step_seconds=meter.step,
        first_batch_seconds=meter.first_batch,
        batches=meter.batches,
        samples=meter.samples,
        storage_bytes=max(0, storage),
        cpu_seconds=max(0.0, after.cpu_seconds - before.cpu_seconds),
        complete=complete,
        loader_class=state.loader_class,
        mode=state.mode,  # type: ignore[arg-type]
        **state.settings,
        hits=hits,
        misses=misses,
        cuda_sync_seconds=meter.cuda_sync,
        stats=stats,
        start_time=meter.start_time,
        end_time=end_time,
        valid_tokens=meter.valid_tokens if tokens else None,
        token_slots=meter.token_slots if tokens else None,
        unique_samples=state.seen.unique if state.seen is not None else None,
        energy_joules=joules,
        energy_source=after.energy_source if joules is not None else None,
        optimizer_steps=updates,
        timeline=meter.timeline(),
        transitions=dict(meter.transitions),
        transitions_before=meter.before_start,
        **slowest(out_dir, state.dataset_id, meter.start_time, end_time),
    )


def token_batches(dl: Any) -> tuple[bool, int | None]:
    """Whether the loader's batches are token batches whose padding is known, and the room a pack was packed
    into: a ``loader.packing.PackingCollator``'s packs (its ``max_len``) or the generated job's padded
    batches (``stallbench.jobs.batching.pad_tokens``), through a timing wrapper's ``collate_fn`` where there
    is one. Any other batch's tokens are not guessed from its shape: (False, None)."""
    collate = getattr(dl, "collate_fn", None)
    collate = getattr(collate, "collate_fn", collate)
    if type(collate).__name__ == "PackingCollator":
        room = getattr(collate, "max_len", None)
        return True, room if isinstance(room, int) else None
    ours = (getattr(collate, "__module__", None), getattr(collate, "__qualname__", None))
    return ours == ("stallbench.jobs.batching", "pad_tokens"), None


def counting_sampler(dl: Any) -> Any:
    """The loader's batch sampler where it counts the distinct indices of its latest pass (the generated
    job's ``SeenIndices``); else None."""
    sampler = getattr(dl, "batch_sampler", None)
    return sampler if derives_from(sampler, "stallbench.jobs.batching", "SeenIndices") else None


def derives_from(obj: Any, module: str, name: str) -> bool:
    """Whether ``obj``'s class is or derives from ``module.name``, known by names: this side never imports
    ``loader``."""
    return any(c.__module__ == module and c.__name__ == name for c in type(obj).mro())


def loader_settings(dl: Any) -> dict[str, Any]:
    """The records' workers, batch size (the batch sampler's where the loader was given one, as accelerate
    and the Hugging Face Trainer do), prefetch factor, dataset length and whether the Dataset is one of
    ``loader``'s."""
    try:
        length = len(dl.dataset)
    except Exception:  # an IterableDataset without a length
        length = None
    batch_size = dl.batch_size
    if batch_size is None:
        batch_size = getattr(dl.batch_sampler, "batch_size", None)
    return {
        "source_backed": derives_from(dl.dataset, "loader.datasets", "SourceDataset"),
        "workers": dl.num_workers,
        "batch_size": batch_size if isinstance(batch_size, int) else None,
        "prefetch_factor": getattr(dl, "prefetch_factor", None),
        "dataset_len": length,
    }


def loader_shape(dl: Any, settings: dict[str, Any]) -> tuple[Any, ...]:
    """What two loaders of one process share when one is the other rebuilt: their classes, the Dataset's
    length and the batch size."""
    return (
        type(dl).__qualname__,
        type(dl.dataset).__qualname__,
        settings["dataset_len"],
        settings["batch_size"],
    )


def epoch_length(dl: Any, steps: int | None) -> int | None:
    """The batches an epoch of ``dl`` hands out when it runs to its end (``len()``, cut to ``steps``); None
    where the loader has no length."""
    try:
        length: int | None = len(dl)
    except Exception:
        length = None
    if steps is not None:
        return steps if length is None else min(length, steps)
    return length


def write_record(out_dir: str, record: LoaderEpoch) -> None:
    """One line, appended whole by a single write: a kill leaves every earlier line readable."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        path = records_path(out_dir, record.rank, record.pid)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (record.to_json() + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        say(f"cannot write records in {out_dir} ({exc}); epochs go unrecorded", key="write")


def _rank() -> int:
    raw = os.environ.get("RANK") or "0"
    try:
        return int(raw)
    except ValueError:
        say(f"RANK={raw!r} is not a number: records say rank 0", key="rank")
        return 0
