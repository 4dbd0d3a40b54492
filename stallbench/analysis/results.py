"""What an analysis produces: plain dataclasses, the source of the JSON schema (``docs/stallbench-json.md``).

Storage figures are device bytes: what the kernel reads, whole pages
(``stallbench.conditions.storage.device_bytes``); a dataset's record bytes (its files' sizes) are kept beside
them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stallbench.analysis.work import UsefulWork
from stallbench.conditions.limits import Limits

__all__ = [
    "steady",
    "SCHEMA",
    "Advised",
    "Breakdown",
    "EpochRecord",
    "LoaderReport",
    "Machine",
    "NodesPrediction",
    "OtherLoader",
    "PrefetchPrediction",
    "Prediction",
    "RankBreakdown",
    "Roofline",
    "RunRecord",
    "Workload",
]

SCHEMA = "stallbench.report/7"


@dataclass(frozen=True)
class Workload:
    """What was run: the same for every loader of a comparison."""

    data: str  # path of the data (image folder, LMDB, Arrow/Parquet) or of the generated workload
    dataset_bytes: int  # device bytes: each file rounded up to whole pages, what reading it all costs
    record_bytes: int  # the files' own bytes, summed (what the cached loader stores, packed)
    samples: int  # records per epoch
    batch_size: int
    workers: int
    compute: str  # compute model, e.g. "emulated:20"
    epochs: int
    cache_bytes: int | None  # the cached loader's capacity; also the memory budget given to every loader
    storage_bandwidth: int | None  # the kernel's read throttle, bytes/s; None: none (``limits``)
    memory_limit: int | None  # the kernel's memory limit of each job; None: none (``limits``)
    command: str | None = None  # the user's own command (``analyze -- CMD``); None for a generated job
    prefetch_factor: int | None = None  # batches each worker keeps ready; None without workers
    opens_own_files: bool = False  # the command's Dataset opens its files itself: ours needs cache_files=

    @property
    def limits(self) -> Limits:
        """The cold run's limits, as the command line asked them (sized where it said "auto")."""
        return Limits(self.storage_bandwidth, self.memory_limit)


@dataclass(frozen=True)
class EpochRecord:
    """One epoch of one run, as the job measured it."""

    epoch: int
    seconds: float
    wait_seconds: float  # the loop waiting for batches, first batch included
    step_seconds: float  # in the training step
    first_batch_seconds: float
    batches: int
    samples: int
    storage_bytes: int  # read from the storage device (kernel count, the job's processes)
    hits: int = 0
    misses: int = 0
    cpu_seconds: float = 0.0  # user + system over the job and its workers
    cuda_sync_seconds: float = 0.0  # your own command on CUDA: synchronising at step boundaries
    valid_tokens: int | None = None  # token batches (``stallbench.batches``): the examples' own tokens
    token_slots: int | None = None  # and the token positions the batches carried, padding included
    unique_samples: int | None = None  # distinct example indices the epoch's order handed out
    energy_joules: float | None = None  # read from a counter (RAPL, NVML); None where none was readable
    energy_source: str | None = None  # which: "rapl", "nvml", "rapl+nvml"
    optimizer_steps: int | None = None  # your own command: optimizer.step() calls; None where it made none
    # per kind of transition (evaluation, checkpoint, compilation), [seconds, count]: inside the epoch's
    # steps (not in step_seconds), and between the loader's previous epoch and this one
    transitions: dict[str, list[float]] = field(default_factory=dict)
    transitions_before: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class SlowSample:
    """A sample whose prep took 4x its process's mean (``stallbench.jobs._sample_times``)."""

    index: int
    seconds: float
    path: str | None = None  # the file it is read from, where the Dataset lists its files


@dataclass(frozen=True)
class RunRecord:
    """One of the three differential runs: "ingestion", "prep" or "cold"."""

    phase: str
    epochs: tuple[EpochRecord, ...]
    condition: str  # what was done to storage/memory, in words
    stage_seconds: dict[str, float] = field(default_factory=dict)  # fetch / decode / collate, summed
    timeline: tuple[tuple[float, float], ...] = ()  # (wait_s, step_s) per iteration of the last epoch
    other_load_cores: float = 0.0  # cores other work on the machine kept busy during the run, on average
    cache_form: str = ""  # our loader: the form of record its cache held (``stats().cache_form``)
    cache_form_epochs: dict[str, float] = field(default_factory=dict)  # and the epoch it weighed per form
    ready_first: bool = False  # our loader: batches made of the samples ready first
    # the last epoch's samples whose prep took 4x their process's mean: how many, the slowest
    slow_sample_count: int = 0
    slow_samples: tuple[SlowSample, ...] = ()
    slow_again: float = 0.0  # the share of their time taken by samples slow the epoch before too: the data's


@dataclass(frozen=True)
class Breakdown:
    """A steady cold epoch in parts that add up to it (``stallbench.analysis.breakdown``), in seconds
    (percentages derived): compute + prep stall + fetch stall + transitions = epoch; each with its spread
    (noise)."""

    epoch_seconds: float
    compute_seconds: float  # the loop's own time in the cold run: the epoch less its wait for batches
    prep_stall_seconds: float
    fetch_stall_seconds: float
    warmup_seconds: float  # first epoch's excess over a steady epoch, plus time to first batch
    contention_seconds: float = 0.0  # of compute: the steps slower than alone, sharing cores with loading
    wait_seconds: float = 0.0  # the wait for batches the cold run measured: prep stall + fetch stall
    step_alone_seconds: float = 0.0  # T1: the steps of an ingestion epoch, as many batches (what-if)
    warm_epoch_seconds: float = 0.0  # T3: the prep run's epoch, every record in memory (what-if)
    warm_first_batch_seconds: float = 0.0  # T3's wait for its first batch: workers start, one batch made
    step_cpu_seconds: float = 0.0  # CPU the steps took alone (the ingestion run's), as many batches
    prep_cpu_seconds: float = 0.0  # CPU the prep run took beyond its steps: decode, augment, collate
    epoch_spread_seconds: float = 0.0  # half the range over the steady cold epochs
    compute_spread_seconds: float = 0.0
    prep_stall_spread_seconds: float = 0.0
    fetch_stall_spread_seconds: float = 0.0
    # per kind (evaluation, checkpoint, compilation), per steady epoch: [seconds, count] inside the epoch,
    # and made between epochs (apart, as warm-up is)
    transitions: dict[str, tuple[float, float]] = field(default_factory=dict)
    transitions_between: dict[str, tuple[float, float]] = field(default_factory=dict)
    warmup_transitions: dict[str, tuple[float, float]] = field(default_factory=dict)  # of warmup_seconds
    # the cold run's wait for each batch of its last epoch (its first batch left out): how it spreads
    batch_wait_p50_seconds: float = math.nan
    batch_wait_p90_seconds: float = math.nan
    batch_wait_p99_seconds: float = math.nan
    batch_wait_max_seconds: float = math.nan
    # of those, the batches that waited SLOW_BATCH times the median or more: how many, and what they waited
    # beyond the median, in seconds and as a share of all that epoch's wait (a few slow samples' toll)
    slow_batches: int = 0
    slow_batches_excess_seconds: float = 0.0
    slow_batches_wait_share: float = 0.0

    @property
    def transition_seconds(self) -> float:
        """The epoch's time in transitions, all kinds: no loader setting changes it."""
        return sum(seconds for seconds, _ in self.transitions.values())

    def percent(self, seconds: float) -> float:
        return 100.0 * seconds / self.epoch_seconds if self.epoch_seconds > 0 else 0.0


@dataclass(frozen=True)
class Machine:
    """Measured, never assumed."""

    cores: int
    storage_bytes_per_s: float  # device bytes per second, read by as many readers as the job has workers
    memory_bytes_per_s: float
    prep_samples_per_s_per_core: float  # samples per CPU second of prep (the runs' own CPU counts)


@dataclass(frozen=True)
class Prediction:
    """Predicted steady epoch time for another cache size or worker count, capped by the ingestion rate."""

    cache_bytes: int
    workers: int
    epoch_seconds: float
    bound: str  # "compute" | "prep" | "fetch"


@dataclass(frozen=True)
class FormPrediction:
    """Predicted steady epoch with our cache holding its records in another form (``cache_form``: raw,
    prepared or mixed), at the measured cache size and workers."""

    form: str
    epoch_seconds: float
    as_run: bool  # the form the measured run held


@dataclass(frozen=True)
class Advised:
    """The setting an advice names, as a run makes it: loaders ``loader`` ("torch" or "cached") with
    ``workers``, our cache at ``cache_bytes`` holding ``cache_form`` (None: as run); its predicted epoch."""

    loader: str
    workers: int
    cache_bytes: int | None
    epoch_seconds: float
    cache_form: str | None = None


@dataclass(frozen=True)
class PrefetchPrediction:
    """Predicted steady epoch with another ``prefetch_factor`` at the measured workers and cache."""

    prefetch_factor: int
    epoch_seconds: float
    bound: str  # "compute" | "prep" | "fetch"


@dataclass(frozen=True)
class NodesPrediction:
    """A steady epoch on ``nodes`` nodes, each with the measured cache: partitioned across them
    (``partition_cache=True``) or independent. Storage in device bytes, all nodes together and per node;
    seconds of a node's epoch; ``storage_share``: the remote records partitioned nodes read from storage
    instead of taking them from the peers (``loader.partition.split``), in the partitioned epoch and
    storage bytes; ``peers_only_epoch_seconds``: the partitioned epoch that takes them all from the peers."""

    nodes: int
    partitioned_storage_bytes: int
    partitioned_storage_bytes_per_node: int
    independent_storage_bytes: int
    independent_storage_bytes_per_node: int
    partitioned_epoch_seconds: float
    independent_epoch_seconds: float
    storage_share: float
    peers_only_epoch_seconds: float


@dataclass(frozen=True)
class Roofline:
    """The data roofline: the epoch can be no faster than the slowest of these three."""

    compute_seconds: float
    prep_seconds: float
    fetch_seconds: float
    bound: str
    efficiency: float  # bound / measured epoch, at most 1.0: 1.0 means the loader reaches the roofline
    bound_ratio: float  # bound / measured epoch as measured: above 1.0 only by the noise of the runs


@dataclass(frozen=True)
class RankBreakdown:
    """One rank's breakdown (a torchrun job): the report's own figures are the slowest rank's."""

    rank: int
    breakdown: Breakdown
    waits_for_others_seconds: float = 0.0  # its last epoch, at the collectives for another rank's data
    holds_others_seconds: float = 0.0  # the others' wait there for its data (their mean): ``collectives``


@dataclass(frozen=True)
class OtherLoader:
    """A loader of the user's command other than the training one (evaluation), in the cold run, apart."""

    loader: str  # "<order first iterated>:<Dataset class>"
    epochs: int
    seconds_per_epoch: float
    batches_per_epoch: float


@dataclass(frozen=True)
class LoaderReport:
    """Everything ``analyze`` says about one loader on one workload."""

    loader: str  # "torch" (torch.utils.data.DataLoader) or "cached" (loader.DataLoader with the cache)
    workload: Workload
    runs: tuple[RunRecord, ...]
    breakdown: Breakdown
    storage_bytes: int  # per steady epoch, device bytes (the kernel's count)
    dataset_bytes: int  # device bytes
    record_bytes: int
    hit_rate: float
    cpu_utilisation: float
    samples_per_s: float
    machine: Machine
    roofline: Roofline
    predictions: tuple[Prediction, ...]
    advice: str
    ranks: tuple[RankBreakdown, ...] = ()  # per rank, when the command ran several (torchrun)
    slowest_rank: int | None = None
    holding_rank: int | None = None  # the rank whose data the others wait for most at the collectives
    other_loaders: tuple[OtherLoader, ...] = ()
    prefetch_predictions: tuple[PrefetchPrediction, ...] = ()
    nodes_predictions: tuple[NodesPrediction, ...] = ()  # the cached loader only
    form_predictions: tuple[FormPrediction, ...] = ()  # the cached loader, where it weighed the forms
    useful: UsefulWork | None = None  # what a steady epoch bought: updates, tokens, energy
    # the cold run's last epoch: samples whose prep took 4x their process's mean, how many and the slowest,
    # and the share of them slow the epoch before too
    slow_sample_count: int = 0
    slow_samples: tuple[SlowSample, ...] = ()
    slow_again: float = 0.0
    advised: Advised | None = None  # the setting the advice names, as a run makes it (``--apply``)


def steady(epochs: list) -> list:
    """Epochs 2.. (epoch 1 fills caches and starts workers); all of them when there is only one."""
    return epochs[1:] if len(epochs) > 1 else epochs
