"""The three differential runs, one method for every job: a generated workload (``phases``) and the user's
own command (``user_analysis``) are two targets of it.

- prep: every file of the data in the page cache, our loader's cache (if any) sized to hold every record:
  T3, the pipeline with nothing to fetch;
- ingestion: batches already made, handed to the step again and again: T1, the step alone (told the prep
  run, so that it can hand out as many batches an epoch as the pipeline did);
- cold: the data evicted from the page cache, the asked storage condition (kernel read throttle, memory
  limit) on the whole process tree, our cache (if any) at the asked size and empty: T2.

prep stall = T3 - T1 and fetch stall = T2 - T3 (``breakdown``). Each run is yielded as soon as it is done,
so an interrupted analysis keeps the finished ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import Limits
from stallbench.conditions.storage import evict_page_cache, warm_page_cache

__all__ = ["PHASES", "Phase", "Target", "cold_condition", "collected", "full_cache_bytes", "three_runs"]

Phase = Literal["prep", "ingestion", "cold"]
PHASES: tuple[Phase, ...] = ("ingestion", "prep", "cold")  # as reports list them: T1, T3, T2
_FULL_MARGIN = 64 << 20


def full_cache_bytes(dataset_bytes: int) -> int:
    """The prep run's cache: every record (device bytes are more than records), its index, a margin."""
    return int(dataset_bytes * 1.01) + _FULL_MARGIN


def cold_condition(limits: Limits) -> str:
    """The cold run's condition in words: the page cache evicted, then each limit asked for."""
    return ", ".join(["page cache evicted", *limits.said(unset=False)])


class Target(Protocol):
    """What the runs are made of: a job that runs once per phase."""

    def data(self) -> Sequence[str | Path]:
        """The files the job reads: warmed before the prep run, evicted before the cold run."""
        ...

    def run(
        self, phase: Phase, *, cache_bytes: int | None, limits: StorageLimits | None, prep: Any = None
    ) -> Any:
        """One run of ``phase``: ``cache_bytes`` for our loader's cache, ``limits`` around the whole process
        tree; the ingestion run is told the prep run's result (``prep``)."""
        ...


def three_runs(
    target: Target, dataset_bytes: int, cache_bytes: int | None, limits: StorageLimits | None
) -> Iterator[tuple[Phase, Any]]:
    """The runs of ``target`` in order, prep first: (phase, what its ``run`` returned). ``cache_bytes`` and
    ``limits`` are the cold run's: the configuration as asked."""
    warm_page_cache(target.data())
    prep = target.run("prep", cache_bytes=full_cache_bytes(dataset_bytes), limits=None)
    yield "prep", prep
    yield "ingestion", target.run("ingestion", cache_bytes=None, limits=None, prep=prep)
    evict_page_cache(target.data())
    yield "cold", target.run("cold", cache_bytes=cache_bytes, limits=limits)


def collected(runs: Iterable[tuple[Phase, Any]], step: Callable[[str], None], label: str) -> dict[Phase, Any]:
    """Every run of ``runs`` (``three_runs``'s pairs), ``step("<label>: <phase> done")`` told as each ends;
    in ``PHASES`` order, as reports list them."""
    got = {}
    for phase, run in runs:
        got[phase] = run
        step(f"{label}: {phase} done")
    return {phase: got[phase] for phase in PHASES}
