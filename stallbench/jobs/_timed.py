"""Timing one epoch of one DataLoader inside the user's process: a proxy around the loader's iterator.

The wait (inside ``__next__``) and the step (from a batch's return to the next ``__next__``) are visible only
at the iterator's boundary, so a proxy there sees both without touching the script. Its hot path is a few
clock reads and additions; the costly counters (``/proc`` reads over the process tree, the loader's stats)
are read once at each end of the epoch. Nothing here imports torch at import time: the bootstrap imports this
module at interpreter start, before the script has decided whether torch is used at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from stallbench.jobs.counters import cpu_seconds, storage_read_bytes

__all__ = ["Counters", "EpochMeter", "TimedIterator", "batch_samples", "handing_out", "read_counters", "say"]

_said: set[str] = set()
_handing = threading.local()  # ``depth``: timed iterators of this thread inside their loader's __next__


def handing_out() -> bool:
    """Whether this thread is inside a timed loader's ``__next__``: a loader iterated there (the torch loader
    a wrapper or a subclass draws its batches from) is part of that one."""
    return getattr(_handing, "depth", 0) > 0


def say(message: str, key: str | None = None) -> None:
    """One line on stderr naming stallbench (with ``key``: only its first time). Never raises: the user's
    script must run on whatever goes wrong in the measuring."""
    if key is not None:
        if key in _said:
            return
        _said.add(key)
    with contextlib.suppress(Exception):
        print(f"stallbench: {message}", file=sys.stderr, flush=True)


def batch_samples(batch: Any) -> int:
    """The first dimension of the first tensor found depth-first in ``batch``; 1 when there is none."""
    import torch

    found = _first_tensor(batch, torch.Tensor, depth=0)
    return int(found.shape[0]) if found is not None and found.dim() > 0 else 1


def _first_tensor(value: Any, tensor: type, depth: int) -> Any:
    if isinstance(value, tensor):
        return value
    if depth > 16 or isinstance(value, (str, bytes)):
        return None
    if isinstance(value, Mapping):
        children: Any = value.values()
    elif isinstance(value, (list, tuple)):
        children = value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        children = (getattr(value, f.name) for f in dataclasses.fields(value))
    else:
        return None
    for child in children:
        found = _first_tensor(child, tensor, depth + 1)
        if found is not None:
            return found
    return None


@dataclasses.dataclass(frozen=True)
class Counters:
    """Cumulative counts at one moment: an epoch's figures are two of these subtracted."""

    storage_bytes: int = 0
    cpu_seconds: float = 0.0
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)  # loader.DataLoader.stats(), asdict

    def stats_since(self, before: Counters) -> dict[str, Any]:
        """Numbers as deltas; anything else (the cache's sizing note) as it is now."""
        numeric = (int, float)
        return {
            key: value - before.stats.get(key, 0)
            if isinstance(value, numeric) and not isinstance(value, bool)
            else value
            for key, value in self.stats.items()
        }


def read_counters(stats: Callable[[], Any] | None) -> Counters:
    """This process tree's storage bytes and CPU seconds, and the loader's counts."""
    storage, cpu = _process_tree()
    values: dict[str, Any] = {}
    if stats is not None:
        try:
            values = dataclasses.asdict(stats())
        except Exception as exc:
            say(f"cannot read the loader's stats() ({exc!r}); its records leave them out", key="stats")
    return Counters(storage, cpu, values)


def _process_tree() -> tuple[int, float]:
    """The process tree's storage bytes and CPU seconds (``loader.system.counters``): workers that have
    exited (a non-persistent loader's, at each epoch's end) still count."""
    try:
        return storage_read_bytes(), cpu_seconds()
    except Exception as exc:
        say(f"cannot read /proc counters ({exc!r}); storage bytes and CPU seconds read 0", key="proc")
        return 0, 0.0


class EpochMeter:
    """One epoch's running totals, from ``iter()`` (``start``) to its end."""

    def __init__(self, start: float, before: Counters, cuda: Any = None, expected: int | None = None) -> None:
        self.start, self.before, self.cuda = start, before, cuda
        self.expected = expected  # the batches the epoch hands out when it runs to its end; None: unknown
        self.wait = self.step = self.first_batch = self.cuda_sync = 0.0
        self.batches = self.samples = 0
        self.last_return: float | None = None  # when the latest batch was handed to the script
        self.closed = False

    @property
    def handed_out_all(self) -> bool:
        """Every batch of the epoch was handed out: a loop that stops at ``len()`` (Lightning, a loop over
        ``range(len(dl))``) never asks for the one past the end, yet its epoch is complete."""
        return self.expected is not None and self.batches >= self.expected > 0

    def end_at(self, now: float) -> float:
        """Where an epoch seen to end at ``now`` (the script's next ``iter()``, its exit) ends: the steps
        after its last batch count as steps."""
        if self.last_return is not None and now > self.last_return:
            self.step += now - self.last_return
            self.last_return = now
        return now

    @property
    def last_activity(self) -> float:
        """The last moment the loop is known to have been in this epoch: where an abandoned one ends."""
        return self.last_return if self.last_return is not None else self.start

    def end_step(self, now: float) -> float:
        """Close the step that began at the latest batch's return; returns the clock after any CUDA sync, so
        the device work the step queued counts as step time."""
        cuda = self.cuda
        if cuda is not None and cuda.is_initialized():
            try:
                cuda.synchronize()
            except Exception as exc:
                say(f"torch.cuda.synchronize() failed ({exc!r}); steps are timed without it", key="sync")
                self.cuda = None
            synced = time.perf_counter()
            self.cuda_sync += synced - now
            now = synced
        self.step += now - self.last_return  # type: ignore[operator]
        return now

    def add_batch(self, asked: float, returned: float, batch: Any) -> None:
        if self.batches == 0:  # the first batch's wait runs from iter(): worker start-up is waiting too
            self.first_batch = returned - self.start
            asked = self.start
        self.wait += returned - asked
        self.batches += 1
        try:
            self.samples += batch_samples(batch)
        except Exception:
            self.samples += 1
        self.last_return = returned


class TimedIterator:
    """The loader's iterator as the script sees it: the same batches, timed; after ``steps`` batches it ends
    the epoch itself and drops the real iterator, as a ``break`` would (its workers shut down as torch does).

    ``on_end(meter, end)`` is called once when the epoch ends on its own (StopIteration or ``steps``).
    """

    def __init__(
        self, inner: Iterator[Any], meter: EpochMeter, steps: int | None, on_end: Callable[..., None]
    ) -> None:
        self._inner: Iterator[Any] | None = inner
        self._meter, self._steps, self._on_end = meter, steps, on_end

    def __iter__(self) -> TimedIterator:
        return self

    def __len__(self) -> int:
        if self._inner is None:
            return 0
        n = len(self._inner)  # type: ignore[arg-type]
        return n if self._steps is None else min(n, self._steps)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_inner", "_meter", "_steps", "_on_end"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __next__(self) -> Any:
        now = time.perf_counter()
        meter, inner = self._meter, self._inner
        if inner is None:
            raise StopIteration
        if meter.closed:  # a newer iter() of the loader ended this epoch's measuring
            return next(inner)
        if meter.last_return is not None:
            now = meter.end_step(now)
            if meter.batches == self._steps:
                self._end(now)
                raise StopIteration
        _handing.depth = getattr(_handing, "depth", 0) + 1
        try:
            batch = next(inner)
        except StopIteration:
            self._end(time.perf_counter())
            raise
        except BaseException:
            meter.wait += time.perf_counter() - now
            raise
        finally:
            _handing.depth -= 1
        meter.add_batch(now, time.perf_counter(), batch)
        return batch

    def _end(self, end: float) -> None:
        self._inner = None
        self._on_end(self._meter, end)
