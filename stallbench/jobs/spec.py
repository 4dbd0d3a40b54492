"""What a job stallbench runs is told, and what it writes back: the contracts between the parent and a child.

A run of the user's own command (``stallbench analyze -- python train.py``): the parent writes a
:class:`JobSpec` as JSON to a file and names it in ``STALLBENCH_JOB``; it puts the bootstrap's folder first
on ``PYTHONPATH``, so every Python process of the command (each torchrun rank, each DataLoader worker)
imports its ``sitecustomize``. The bootstrap appends one JSON object per line to
``<out_dir>/records-<rank>-<pid>.jsonl``: a :class:`LoaderEpoch` each time a loader's epoch ends, complete
or cut short, so a run that is killed keeps every epoch it finished.

A generated job is a command like any other: ``python -m stallbench.jobs.workload JOB.json`` (or a script that
calls ``stallbench.jobs.workload.main``), run under a JobSpec and measured by the same bootstrap; ``JOB.json``
holds a :class:`WorkloadJob`, what the script trains on, as a user's script holds its own settings.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from stallbench.jobs.kinds import SWAPPABLE, check_kind

__all__ = [
    "AS_IS",
    "SETTING_FIELDS",
    "GENERATED_STATS",
    "JOB_ENV",
    "RECORDS_GLOB",
    "JobSpec",
    "LoaderEpoch",
    "WorkloadJob",
    "read_records",
    "read_targets",
    "records_path",
    "target_path",
]

JOB_ENV = "STALLBENCH_JOB"  # the path of the JobSpec's JSON file
GENERATED_STATS = "stallbench_stats"  # on a generated job's torch loader: its stage counters (``kinds``)
RECORDS_GLOB = "records-*.jsonl"
AS_IS = "as-is"  # a run of the user's command that leaves its loader classes alone
# our loader's stats() a run hands back as they are: how its cache held records, how it made batches
SETTING_FIELDS = ("cache_form", "cache_form_epochs", "ready_first")
TRANSFORMS = ("train", "eval", "none")
CACHE_FORMS = ("auto", "raw", "prepared")  # loader.DataLoader's cache_form, named without importing torch
PACKINGS = ("ffd", "spfhp", "nextfit")  # loader.packing's algorithms, named here without importing torch

Mode = Literal["pipeline", "ingestion"]
_MODES = ("pipeline", "ingestion")


class _JsonFile:
    """A frozen dataclass a parent hands a child as JSON in a file."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, text: str) -> Any:
        raw = json.loads(text)
        unknown = set(raw) - {f.name for f in fields(cls)}  # type: ignore[arg-type]
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
        return cls(**raw)

    def write(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_text(self.to_json())
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> Any:
        return cls.from_json(Path(path).read_text())


@dataclass(frozen=True)
class JobSpec(_JsonFile):
    """One run of the user's command.

    ``mode``: "pipeline" runs the loaders as the script made them; "ingestion" keeps each loader's first
    ``replay_batches`` batches (made in the script's own process, no worker started) and hands copies of them
    out for every later batch: the step alone.
    ``steps``: batches per epoch of every loader, after which the epoch ends early (the script sees a normal
    end of epoch); None: the loader's own length.
    ``epochs``: epochs of the training loader (the one iterated most); when they are done the script's
    process exits 0 at the next ``iter()`` of that loader. None: the script decides.
    ``loader``: "as-is" leaves the script's loader classes alone; "torch" makes every ``loader.DataLoader``
    the script builds a plain ``torch.utils.data.DataLoader``; "cached" makes every DataLoader the script
    builds a ``loader.DataLoader`` with ``cache_bytes`` and ``cache_dir``, and with ``cache_files=data``
    where the Dataset is not one of ours (its own reads of files under ``data`` go through the cache).
    ``sync_cuda``: synchronise the CUDA device at each step boundary (when CUDA is in use), so a step's
    time includes the device's work.
    ``workers`` / ``prefetch_factor``: every DataLoader the script builds gets these instead of its own
    (``--apply`` runs the advised setting so); ``cache_form``: every ``loader.DataLoader`` gets it.
    ``replay_lengths``: per loader id, the batches of each epoch an earlier run of the command handed out;
    ingestion hands out as many for a loader whose own length does not say (an iterable Dataset).
    """

    out_dir: str
    mode: Mode = "pipeline"
    steps: int | None = None
    epochs: int | None = None
    loader: str = AS_IS  # "as-is" or a kind of ``stallbench.jobs.kinds``
    cache_bytes: int | None = None
    cache_dir: str | None = None
    data: tuple[str, ...] = ()
    replay_batches: int = 4
    sync_cuda: bool = True
    workers: int | None = None  # every DataLoader built with this num_workers (--apply); None: as written
    prefetch_factor: int | None = None  # and this prefetch_factor (with workers); None: as written
    cache_form: str | None = None  # every loader.DataLoader built with this cache_form; None: as written
    replay_lengths: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", tuple(self.data))
        lengths = {str(k): tuple(v) for k, v in dict(self.replay_lengths).items()}
        if not all(v and all(_is_int(n) and n >= 0 for n in v) for v in lengths.values()):
            raise ValueError(
                f"replay_lengths must map loader ids to batch counts, got {self.replay_lengths!r}"
            )
        object.__setattr__(self, "replay_lengths", lengths)
        _check_choice("mode", self.mode, _MODES)
        _check_choice("loader", self.loader, (AS_IS, *SWAPPABLE))
        if self.workers is not None and not _is_int(self.workers):
            raise ValueError(f"workers must be an int or None, got {self.workers!r}")
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"workers must not be negative, got {self.workers!r}")
        for name in ("steps", "epochs", "cache_bytes", "prefetch_factor"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if self.cache_form is not None:
            _check_choice("cache_form", self.cache_form, CACHE_FORMS)
        if self.replay_batches < 1:
            raise ValueError(f"replay_batches must be at least 1, got {self.replay_batches!r}")

    @property
    def overrides(self) -> bool:
        """Whether the DataLoaders the script builds get any argument other than its own (``--apply``'s,
        and the run's own ``cache_dir``)."""
        return (self.workers, self.prefetch_factor, self.cache_form, self.cache_dir) != (None,) * 4

    @classmethod
    def from_env(cls) -> JobSpec | None:
        """The spec named by ``STALLBENCH_JOB``, or None when this process is not part of a run."""
        where = os.environ.get(JOB_ENV)
        return cls.read(where) if where else None


@dataclass(frozen=True)
class WorkloadJob(_JsonFile):
    """What a generated job trains on: ``epochs`` epochs of one loader kind over ``data`` (an image folder, an
    LMDB folder, an Arrow/Parquet file, tar shards or ``s3://bucket/prefix``), each batch through the
    ``compute`` model (None: no step). How a run treats it (the ingestion run's replay, epochs cut to a
    number of steps, the limits) is the run's :class:`JobSpec`, as for the user's own command.

    ``cache_bytes`` (bytes, "auto", or None for the loader's default) and ``cache_dir`` go to a kind with our
    cache; ``transform`` is "train", "eval" or "none" (a script that calls ``workload.main(transform=...)``
    brings its own). ``coordinate`` names a group for a kind that can share prepared batches with
    the other jobs of the group (``compare --jobs``); its first epoch waits for ``group_size`` of them to
    join, so jobs started together share from the first batch. A kind that cannot share ignores both.
    ``packing`` (token data only) names a ``loader.packing`` algorithm: each step is then one pack of at most
    ``max_len`` tokens instead of ``batch_size`` padded sequences. ``persistent_workers``: as torch's
    argument (a run that cuts its epochs to a few steps gives False: see ``stallbench.jobs.data``).
    """

    loader: str
    data: str
    epochs: int = 3
    workers: int = 2
    batch_size: int = 64
    cache_bytes: int | str | None = None
    cache_dir: str | None = None  # None: the loader's default (``loader.system.home``)
    transform: str = "train"
    compute: str | None = None
    seed: int = 0
    coordinate: str | None = None
    group_size: int = 1
    packing: str | None = None
    max_len: int | None = None
    persistent_workers: bool = True

    def __post_init__(self) -> None:
        check_kind(self.loader)
        object.__setattr__(self, "data", os.fspath(self.data))
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        _check_choice("transform", self.transform, TRANSFORMS)
        if not (self.cache_bytes in (None, "auto") or _is_int(self.cache_bytes)):
            raise ValueError(f"cache_bytes must be bytes, 'auto' or None, got {self.cache_bytes!r}")
        if not (self.coordinate is None or (isinstance(self.coordinate, str) and self.coordinate)):
            raise ValueError(f"coordinate must be a group name or None, got {self.coordinate!r}")
        if not (_is_int(self.group_size) and self.group_size >= 1):
            raise ValueError(f"group_size must be a positive int, got {self.group_size!r}")
        if self.packing is not None:
            _check_choice("packing", self.packing, PACKINGS)
            if not (_is_int(self.max_len) and self.max_len >= 1):
                raise ValueError(f"packing needs max_len, a positive int of tokens, got {self.max_len!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        listed = " or ".join([", ".join(map(repr, choices[:-1])), repr(choices[-1])])
        raise ValueError(f"{name} must be {listed}, got {value!r}")


@dataclass(frozen=True)
class LoaderEpoch:
    """One epoch of one DataLoader in one process of the user's command, as the bootstrap measured it."""

    loader: str  # the loader's id in this process: "<order made>:<Dataset class>", e.g. "0:ImageFolder"
    rank: int  # the process's RANK (torchrun), 0 without one
    pid: int
    epoch: int  # 1-based, per loader
    seconds: float  # iter() to the end of the epoch (the StopIteration, or the early end after ``steps``)
    wait_seconds: float  # inside the loader's __next__, the first batch's wait included
    step_seconds: float  # between a batch's return and the next __next__ call
    first_batch_seconds: float
    batches: int
    samples: int  # the batches' first dimension, summed (batches where it is unknown)
    storage_bytes: int  # read from storage by this process and its workers during the epoch (kernel count)
    cpu_seconds: float  # user + system of this process and its workers during the epoch
    complete: bool  # the loader ran out (or ``steps`` was reached); False: the loop left early
    loader_class: str  # the class that made the batches: "torch.utils.data.DataLoader", "loader.DataLoader"
    mode: Mode = "pipeline"
    workers: int = 0  # the loader's num_workers, batch_size and prefetch_factor (None where torch has none)
    batch_size: int | None = None
    prefetch_factor: int | None = None
    dataset_len: int | None = None  # len(loader.dataset), None where it has none (an IterableDataset)
    source_backed: bool = False  # the Dataset is one of loader's; else ours caches it with cache_files=
    hits: int = 0  # our cache's hits and misses in the epoch (loader.DataLoader), else 0
    misses: int = 0
    cuda_sync_seconds: float = 0.0  # time spent synchronising the device at step boundaries
    stats: dict[str, Any] = field(default_factory=dict)  # the loader's stats() deltas, where it has them
    start_time: float = 0.0  # time.monotonic() at iter() and at the epoch's end: one clock for every
    end_time: float = 0.0  # process of the machine, so jobs run at once can be lined up (compare --jobs)
    valid_tokens: int | None = None  # token batches (``stallbench.batches``): the examples' own tokens
    token_slots: int | None = None  # and the token positions the batches carried, padding included
    unique_samples: int | None = None  # distinct example indices the epoch's order handed out, if counted
    energy_joules: float | None = None  # read from a counter (``stallbench.energy``), where one is readable
    energy_source: str | None = None
    optimizer_steps: int | None = None  # optimizer.step() calls in the epoch; None: the process made none
    timeline: list[list[float]] = field(default_factory=list)  # [wait, step] per batch, the first 100,000
    # per kind ("evaluation", "checkpoint", "compilation": ``jobs._transitions``), [seconds, count]: made
    # inside the epoch's steps (and taken out of step_seconds), and since the loader's previous epoch ended
    transitions: dict[str, list[float]] = field(default_factory=dict)
    transitions_before: dict[str, list[float]] = field(default_factory=dict)
    # samples whose prep took 4x their process's mean (``jobs._sample_times``): how many, the slowest
    # [index, seconds, path or None]
    slow_sample_count: int = 0
    slow_samples: list[list[Any]] = field(default_factory=list)
    slow_times: list[list[float]] = field(default_factory=list)  # [index, seconds] of all (1,000 at most)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def records_path(out_dir: str | os.PathLike, rank: int, pid: int) -> Path:
    return Path(out_dir) / f"records-{rank}-{pid}.jsonl"


def target_path(out_dir: str | os.PathLike, rank: int, pid: int) -> Path:
    """Where a process of the user's command leaves its ``stallbench.time_to_target`` results."""
    return Path(out_dir) / f"target-{rank}-{pid}.jsonl"


def read_targets(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The time-to-target results the run's processes left, rank 0's first; a line cut short is left out."""
    found = []
    for path in sorted(Path(out_dir).glob("target-*.jsonl"), key=lambda p: int(p.name.split("-")[1])):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def read_records(out_dir: str | os.PathLike) -> list[LoaderEpoch]:
    """Every epoch record the run's processes wrote; a line cut short by a kill is left out."""
    known = {f.name for f in fields(LoaderEpoch)}
    records = []
    for path in sorted(Path(out_dir).glob(RECORDS_GLOB)):
        for line in path.read_text().splitlines():
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                continue
            records.append(LoaderEpoch(**{k: v for k, v in raw.items() if k in known}))
    return records
