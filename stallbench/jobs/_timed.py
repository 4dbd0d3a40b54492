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
import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from stallbench.jobs import _transitions as transitions
from stallbench.jobs._updates import optimizer_steps
from stallbench.jobs.counters import cpu_seconds, storage_read_bytes

__all__ = [
    "LEVELS",
    "TIMELINE_BATCHES",
    "Counters",
    "EpochMeter",
    "TimedIterator",
    "handing_out",
    "read_counters",
    "say",
]

TIMELINE_BATCHES = 100_000  # batches of an epoch whose wait and step are kept one by one
# loader.LoaderStats fields that say where the cache stands, not what an epoch did: kept as at its end
LEVELS = frozenset(
    {"cache_bytes_used", "cache_capacity", "cache_bytes_given_back", "records_cached", "memory_pauses"}
)
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


@dataclasses.dataclass(frozen=True)
class Counters:
    """Cumulative counts at one moment: an epoch's figures are two of these subtracted."""

    storage_bytes: int = 0
    cpu_seconds: float = 0.0
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)  # loader.DataLoader.stats(), asdict
    joules: float | None = None  # the machine's energy counter (``stallbench.energy``); None: none readable
    energy_source: str | None = None
    optimizer_steps: int | None = None  # ``optimizer.step()`` calls so far (``_updates``); None: none yet

    def stats_since(self, before: Counters) -> dict[str, Any]:
        """Counts as deltas; levels (``LEVELS``) and anything else (the cache's sizing note) as now."""
        numeric = (int, float)
        return {
            key: value - before.stats.get(key, 0)
            if isinstance(value, numeric) and not isinstance(value, bool) and key not in LEVELS
            else value
            for key, value in self.stats.items()
        }


def read_counters(stats: Callable[[], Any] | None) -> Counters:
    """This process tree's storage bytes and CPU seconds, the loader's counts and the energy counter."""
    storage, cpu = _process_tree()
    values: dict[str, Any] = {}
    if stats is not None:
        try:
            values = dataclasses.asdict(stats())
        except Exception as exc:
            say(f"cannot read the loader's stats() ({exc!r}); its records leave them out", key="stats")
    meter = _energy_meter()
    try:
        joules = meter.joules() if meter is not None else None
    except Exception as exc:
        say(f"cannot read the energy counter ({exc!r}); records leave energy out", key="energy")
        joules = None
    source = meter.source if joules is not None else None
    return Counters(storage, cpu, values, joules, source, optimizer_steps())


@functools.cache
def _energy_meter() -> Any:
    """The machine's energy counters, opened once per process (``stallbench.energy``); None where none is."""
    from stallbench.energy import open_meter

    try:
        return open_meter()
    except Exception:
        return None


def _process_tree() -> tuple[int, float]:
    """The process tree's storage bytes and CPU seconds (``loader.system.counters``): workers that have
    exited (a non-persistent loader's, at each epoch's end) still count."""
    try:
        return storage_read_bytes(), cpu_seconds()
    except Exception as exc:
        say(f"cannot read /proc counters ({exc!r}); storage bytes and CPU seconds read 0", key="proc")
        return 0, 0.0


class EpochMeter:
    """One epoch's running totals, from ``iter()`` (``start``) to its end. ``counts_tokens``: the batches are
    token batches whose padding is known, ``room`` the tokens a pack was packed into
    (``stallbench.batches``). A step's transitions (another loader's epoch, a checkpoint write, a compilation:
    ``stallbench.jobs._transitions``) are taken out of it and kept apart, by kind."""

    def __init__(
        self,
        start: float,
        before: Counters,
        cuda: Any = None,
        expected: int | None = None,
        counts_tokens: bool = False,
        room: int | None = None,
        loader: str | None = None,
        kept_batches: int = TIMELINE_BATCHES,
        phases_of: str | None = None,
    ) -> None:
        self.start, self.before, self.cuda = start, before, cuda
        self.kept_batches = kept_batches  # batches whose wait and step are kept one by one
        self.phases_of = phases_of  # a profile's meter: only its own marked phases are taken out
        self.called = start  # when the script called iter(), before the measuring began
        self.loader = loader  # the loader's id: its own epochs are no transition of its own
        self.transitions: dict[str, list[float]] = {}  # per kind, [seconds, count] taken out of the steps
        self.started = self._marks = transitions.reading()
        self._step_began = start  # the latest step's start (a hold's ``end_at`` leaves it)
        self.before_start: dict[str, list[float]] = {}  # transitions since the loader's previous epoch
        self.counts_tokens, self.room = counts_tokens, room
        self.start_time = time.monotonic()  # the machine's one clock, for lining jobs up
        self.expected = expected  # the batches the epoch hands out when it runs to its end; None: unknown
        self.wait = self.step = self.first_batch = self.cuda_sync = 0.0
        self.batches = self.samples = 0
        self.valid_tokens = self.token_slots = 0  # 0 and 0 at the end: no token batch
        self.batch_waits: list[float] = []  # per batch, the first ``kept_batches``
        self.batch_steps: list[float] = []
        self.last_return: float | None = None  # when the latest batch was handed to the script
        self.asked = start  # when the script last asked for a batch (``__next__``), or called iter()
        # (when, transitions' reading, counters): it handed out all its batches and another loader was
        # iterated then; its epoch ends there unless its loop asks for one more (``end_step``)
        self.held: tuple[float, int, Counters] | None = None
        self.closed = False

    @property
    def handed_out_all(self) -> bool:
        """Every batch of the epoch was handed out: a loop that stops at ``len()`` (Lightning, a loop over
        ``range(len(dl))``) never asks for the one past the end, yet its epoch is complete."""
        return self.expected is not None and self.batches >= self.expected > 0

    def ended_in(self, step_began: float) -> bool:
        """Whether the epoch began after ``step_began`` (in another loader's step) and handed out all its
        batches."""
        return self.handed_out_all and self.start >= step_began

    def hold(self, now: float, counters: Callable[[], Counters]) -> None:
        """An epoch that handed out all its batches is held at ``now``, with the ``counters()`` it would end
        with there (its first hold stands: ``held``)."""
        if self.handed_out_all and self.held is None:
            self.end_at(now)
            self.held = (now, transitions.reading(), counters())

    def end_at(self, now: float) -> float:
        """Where an epoch seen to end at ``now`` (the script's next ``iter()``, its exit) ends: the steps
        after its last batch count as steps."""
        if self.last_return is not None and now > self.last_return:
            self._add_step(now - self.last_return)
            self.last_return = now
        return now

    @property
    def last_activity(self) -> float:
        """The last moment the loop is known to have been in this epoch: where an abandoned one ends."""
        return self.last_return if self.last_return is not None else self.start

    def end_step(self, now: float) -> float:
        """Close the step that began at the latest batch's return; returns the clock after any CUDA sync, so
        the device work the step queued counts as step time. An epoch held (``held``) goes on: its loop
        asked for more."""
        self.held = None
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
        self._add_step(now - self.last_return)  # type: ignore[operator]
        return now

    def _add_step(self, seconds: float) -> None:
        """A step, or more of the last one (the time after an epoch's last batch, ``end_at``), less the
        transitions begun in it (since the latest batch's return)."""
        began = self._step_began
        made = transitions.since(self._marks, self.loader, began_after=began, phases_of=self.phases_of)
        for kind, (spent, count) in made.items():
            total = self.transitions.setdefault(kind, [0.0, 0])
            total[0] += spent
            total[1] += count
            seconds -= spent
        self._marks = transitions.reading()
        seconds = max(0.0, seconds)  # the clocks of two calls apart: never a negative step
        self.step += seconds
        if len(self.batch_steps) < len(self.batch_waits):
            self.batch_steps.append(seconds)
        elif self.batch_steps and len(self.batch_steps) == self.batches:
            self.batch_steps[-1] += seconds

    def add_batch(self, asked: float, returned: float, batch: Any) -> None:
        if self.batches == 0:  # the first batch's wait runs from iter(): worker start-up is waiting too
            self.first_batch = returned - self.start
            asked = self.start
        self.wait += returned - asked
        self.batches += 1
        if len(self.batch_waits) < self.kept_batches:
            self.batch_waits.append(returned - asked)
        try:
            if "torch" not in sys.modules:  # no tensor in it (a list profiled): not torch's import time
                raise LookupError
            from stallbench import batches

            self.samples += batches.batch_samples(batch)
            tokens = batches.batch_tokens(batch, self.room) if self.counts_tokens else None
        except Exception:
            self.samples, tokens = self.samples + 1, None
        if tokens is not None:
            self.valid_tokens += tokens.valid
            self.token_slots += tokens.slots
        self.last_return = self._step_began = returned
        self._marks = transitions.reading()  # the step begins

    def timeline(self) -> list[list[float]]:
        """[wait, step] per batch (a batch whose step has not ended: 0)."""
        steps = self.batch_steps + [0.0] * (len(self.batch_waits) - len(self.batch_steps))
        return [[wait, step] for wait, step in zip(self.batch_waits, steps, strict=True)]


_OWN_ATTRIBUTES = frozenset({"_inner", "_meter", "_steps", "_on_end", "_before_step_end", "_nests"})


class TimedIterator:
    """The loader's iterator as the script sees it: the same batches, timed; after ``steps`` batches it ends
    the epoch itself and drops the real iterator, as a ``break`` would (its workers shut down as torch does).

    ``on_end(meter, end)`` is called once when the epoch ends on its own (StopIteration or ``steps``);
    ``before_step_end(now)`` before each step is closed (other loaders' epochs inside it end first; it
    returns the clock the step ends at). ``hands_out``: inside its ``__next__`` the thread is handing out
    batches (``handing_out``), so a loader iterated there is part of this one; a profile's iterator is not
    the bootstrap's, and says so with False.
    """

    def __init__(
        self,
        inner: Iterator[Any],
        meter: EpochMeter,
        steps: int | None,
        on_end: Callable[..., None],
        before_step_end: Callable[[float], float] | None = None,
        hands_out: bool = True,
    ) -> None:
        self._inner: Iterator[Any] | None = inner
        self._meter, self._steps, self._on_end = meter, steps, on_end
        self._before_step_end = before_step_end
        self._nests = 1 if hands_out else 0

    def __iter__(self) -> TimedIterator:
        return self

    def __len__(self) -> int:
        if self._inner is None:
            return 0
        n = len(self._inner)  # type: ignore[arg-type]
        return n if self._steps is None else min(n, self._steps)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN_ATTRIBUTES:
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
            if self._before_step_end is not None:
                now = self._before_step_end(now)
            now = meter.end_step(now)
            if meter.batches == self._steps:
                self._end(now)
                raise StopIteration
        meter.asked = now
        _handing.depth = getattr(_handing, "depth", 0) + self._nests
        try:
            batch = next(inner)
        except StopIteration:
            self._end(time.perf_counter())
            raise
        except BaseException:
            meter.wait += time.perf_counter() - now
            raise
        finally:
            _handing.depth -= self._nests
        meter.add_batch(now, time.perf_counter(), batch)
        return batch

    def _end(self, end: float) -> None:
        self._inner = None
        self._on_end(self._meter, end)
