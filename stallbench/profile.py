"""Time a user's own training loop: how long each batch is waited for, and how long each step takes.

    prof = stallbench.profile(loader, name="resnet50")
    for epoch in range(3):
        for batch in prof:              # each ``for`` over prof is one epoch
            train_step(batch)
        with prof.phase("eval"):        # marked phases: evaluation, checkpointing, ...
            evaluate()
    print(prof.summary())
    prof.save("profile.json")

A batch's *wait* is the time inside the loader's ``__next__`` (the first one includes ``iter(loader)``:
worker start-up and prefetch); its *step* is the time from that return to the next ``__next__`` call, less
marked phases. Each epoch is timed by the one timing layer that ``stallbench analyze`` measures a command
with (``stallbench.jobs._timed``); a phase is a transition of that layer too. Transitions are reported
apart from the steady state: each epoch's first batch, the time inside the final ``__next__`` that raised
StopIteration (epoch end wait), the gap from one epoch's end to the next epoch's first call less marked
phases, and the phases. Steady state is every other batch. A loop left by ``break`` or an exception
(KeyboardInterrupt included) keeps its partial epoch.

JSON written by ``save`` (``PROFILE_SCHEMA_VERSION = 1``; seconds throughout; null where not measured)::

    {"schema": "stallbench.profile/1", "name": str,
     "epochs": [{"index": int, "iterations": int, "complete": bool (the loader was exhausted),
                 "seconds": first call to end, "wait_s", "step_s", "first_batch_s", "end_wait_s"}],
     "steady": {"iterations": int, "wait_s", "step_s", "wait_fraction" (wait / (wait + step)),
                "iterations_per_s", "wait_mean_s", "wait_p50_s", "wait_p95_s",
                "step_mean_s", "step_p50_s", "step_p95_s"},
     "transitions": {"first_batch_s": [...], "epoch_gap_s": [... one per pair of consecutive epochs],
                     "epoch_end_wait_s": [...], "phases": {name: [seconds, ...]}},
     "loader_stats": the loader's stats() as a dict (loader.DataLoader), or null}
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from stallbench import _timeline
from stallbench._files import write_atomic
from stallbench._grid import grid
from stallbench._timeline import PhaseRecord, ProfiledEpoch, Timeline
from stallbench._words import counted
from stallbench.jobs._timed import Counters, EpochMeter, TimedIterator
from stallbench.jobs._transitions import marked, reading

__all__ = ["PROFILE_SCHEMA_VERSION", "Profile", "Timeline", "profile"]

PROFILE_SCHEMA_VERSION = 1


class Profile:
    """Iterate over it in place of the loader; each ``for`` is one epoch. Made by :func:`profile`."""

    def __init__(self, loader: Iterable[Any], name: str) -> None:
        self.loader = loader
        self.name = name
        self._epochs: list[ProfiledEpoch] = []
        self._phases: list[PhaseRecord] = []
        self._open_phase: str | None = None
        self._id = f"profile:{id(self)}"  # its phases' source: another profile's meter leaves them in

    def __iter__(self) -> Iterator[Any]:
        return self._epoch()

    def _epoch(self) -> Iterator[Any]:
        if self._open_phase is not None:
            raise ValueError(f"an epoch cannot run inside phase {self._open_phase!r}; mark phases between")
        # every batch kept one by one, and only this profile's phases taken out of its steps
        meter = EpochMeter(time.perf_counter(), Counters(), kept_batches=sys.maxsize, phases_of=self._id)
        epoch = ProfiledEpoch(meter)
        self._epochs.append(epoch)

        def exhausted(_: EpochMeter, end: float) -> None:
            epoch.exhausted, epoch.end, epoch.end_wait = True, end, end - meter.asked

        try:  # iter() too: a loader that fails to start ends its epoch there, as one that fails later
            timed = TimedIterator(iter(self.loader), meter, None, exhausted, hands_out=False)
            for batch in timed:  # noqa: UP028 (``yield from`` would close the loader's iterator at a break)
                yield batch
        finally:
            if epoch.end is None:  # left by break or an error: a step running then ends now
                now = time.perf_counter()
                waiting = meter.last_return is None or meter.asked > meter.last_return
                epoch.end = now if waiting else meter.end_at(now)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark a stretch outside the steady state (evaluation, checkpointing); phases do not nest."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"phase name must be a non-empty string, got {name!r}")
        if self._open_phase is not None:
            raise ValueError(
                f"phase {name!r} cannot start inside phase {self._open_phase!r}: phases do not nest"
            )
        self._open_phase = name
        start, inside = time.perf_counter(), reading()
        try:
            yield
        finally:
            end = time.perf_counter()
            self._phases.append(PhaseRecord(name, start, end))
            marked(self._id, start, end, inside)  # taken out of the step it began in
            self._open_phase = None

    def timeline(self) -> Timeline:
        """Per batch: epoch, index in the epoch, wait_s, step_s (NaN while a step is still running)."""
        return _timeline.timeline(self._epochs)

    def to_dict(self) -> dict[str, Any]:
        """What ``save`` writes (see the module docstring for the schema)."""
        return {
            "schema": f"stallbench.profile/{PROFILE_SCHEMA_VERSION}",
            "name": self.name,
            "epochs": _timeline.epoch_rows(self._epochs),
            "steady": _timeline.steady_state(self.timeline()),
            "transitions": _timeline.transitions(self._epochs, self._phases),
            "loader_stats": _loader_stats(self.loader),
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the JSON atomically (a temporary file in the same folder, then a rename)."""
        return write_atomic(path, json.dumps(self.to_dict(), indent=2).encode())

    def summary(self) -> str:
        """A readable table of the steady state, the transitions and each epoch."""
        data = self.to_dict()
        return "\n".join([*_steady_lines(data), *_transition_lines(data["transitions"]), *_epoch_lines(data)])


def profile(loader: Iterable[Any], name: str | None = None) -> Profile:
    """Wrap ``loader`` (any re-iterable: torch or stallbench DataLoader, a list) to time a training loop."""
    if not isinstance(loader, Iterable):
        raise TypeError(f"profile() needs an iterable loader, got {type(loader).__name__}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    return Profile(loader, name or type(loader).__name__)


def _loader_stats(loader: object) -> dict[str, Any] | None:
    stats = getattr(loader, "stats", None)
    if not callable(stats):
        return None
    value = stats()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    warnings.warn(
        f"{type(loader).__name__}.stats() returned {type(value).__name__}, not a dataclass or "
        "mapping: loader_stats left out",
        stacklevel=3,
    )
    return None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _steady_lines(data: dict[str, Any]) -> list[str]:
    s = data["steady"]
    share = "-" if s["wait_fraction"] is None else f"{s['wait_fraction']:.1%}"
    rate = "-" if s["iterations_per_s"] is None else f"{s['iterations_per_s']:.1f}"
    batches = sum(e["iterations"] for e in data["epochs"])
    rows = [
        (f"  {k}", [f"{s[f'{k}_s']:.3f}", *(_ms(s[f"{k}_{q}_s"]) for q in ("mean", "p50", "p95"))])
        for k in ("wait", "step")
    ]
    return [
        f"profile {data['name']!r}: {counted(len(data['epochs']), 'epoch')}, "
        f"{counted(batches, 'batch', 'batches')}",
        f"steady state: {s['iterations']} batches, {rate} it/s, waiting for data {share} of the time",
        *grid("", ["total s", "mean ms", "p50 ms", "p95 ms"], rows),
    ]


def _transition_lines(t: dict[str, Any]) -> list[str]:
    rows = [("first batch", t["first_batch_s"]), ("epoch end wait", t["epoch_end_wait_s"])]
    rows += [("epoch gap", t["epoch_gap_s"])] + [(f"phase {k!r}", v) for k, v in t["phases"].items()]
    cells = [(f"  {label}", [str(len(v)), f"{sum(v):.4f}", f"{max(v):.4f}"]) for label, v in rows if v]
    return ["transitions (outside the steady state)", *grid("", ["times", "total s", "max s"], cells)]


def _epoch_cells(e: dict[str, Any]) -> list[str]:
    times = [f"{e[k]:.3f}" for k in ("seconds", "wait_s", "step_s")]
    return [str(e["iterations"]), *times, _ms(e["first_batch_s"]), "yes" if e["complete"] else "no"]


def _epoch_lines(data: dict[str, Any]) -> list[str]:
    header = ["batches", "seconds", "wait s", "step s", "first ms", "complete"]
    rows = [(f"  {e['index']}", _epoch_cells(e)) for e in data["epochs"]]
    return ["epochs", *grid("  epoch", header, rows)]
