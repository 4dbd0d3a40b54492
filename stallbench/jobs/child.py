"""The measuring side of ``stallbench analyze -- python train.py``: the bootstrap's ``sitecustomize`` calls
:func:`install` in every Python process of the user's command while ``STALLBENCH_JOB`` names a JobSpec.

``install`` patches nothing itself: a hook on ``sys.meta_path`` (``_replay.install_hooks``) acts right
after torch's ``torch.utils.data.dataloader`` is imported, so a process that never imports torch pays
nothing, and a swapped loader class is in place before the script's own ``from torch.utils.data import
DataLoader``. From then on each ``iter()`` of a DataLoader in the main process (never in its workers) hands
out a timed proxy, and each epoch's end appends one LoaderEpoch line to this process's records file.

A loader is timed at the ``__iter__`` the script calls: a subclass that overrides it (timm's
``MultiEpochsDataLoader`` keeps one torch iterator for good and hands out ``len()`` batches of it an epoch) is
timed at its own ``__iter__``, torch's inside it only feeds it. A loader rebuilt with the same shape (the
Hugging Face Trainer builds a new evaluation DataLoader at every ``evaluate()``) keeps the first one's id.

An epoch ends on StopIteration or after ``steps`` batches (complete). One that handed out all its ``len()``
batches without being asked for one more (Lightning, a loop over ``range(len(dl))``) is complete too, and
ends at the script's next ``iter()`` of any loader or at its exit: the steps after its last batch count as
steps. A loop left early ends at the loader's next ``iter()`` or at exit (not complete; it ends at its last
batch). Wait, step, batches, samples, tokens and the per-batch timeline are the loader's own; storage bytes,
CPU seconds and energy are the process tree's (the machine's, for energy) over the epoch, so an abandoned
epoch closed later also counts what ran in between. A generated job (``stallbench.jobs.workload``) is
measured here the same way: its records are the user's command's.
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from stallbench.conditions.storage import in_object_storage
from stallbench.jobs import _transitions as transitions
from stallbench.jobs._ending import end_process, exit_quickly
from stallbench.jobs._hooks import install_hooks
from stallbench.jobs._loaders import (
    LoaderState,
    counting_sampler,
    derives_from,
    epoch_length,
    epoch_record,
    loader_settings,
    loader_shape,
    token_batches,
    write_record,
)
from stallbench.jobs._replay import replay_for
from stallbench.jobs._timed import EpochMeter, TimedIterator, handing_out, read_counters, say
from stallbench.jobs._updates import watch_optimizers
from stallbench.jobs.spec import GENERATED_STATS, JobSpec

__all__ = ["install"]

_run: _Run | None = None


def install(spec: JobSpec | None = None) -> bool:
    """Measure this process's DataLoaders as ``spec`` asks (default: the spec ``STALLBENCH_JOB`` names).

    Returns False when there is no spec (nothing is done), True once installed; a second call does nothing.
    """
    global _run
    if _run is not None:
        return True
    spec = spec if spec is not None else JobSpec.from_env()
    if spec is None:
        return False
    _run = _Run(spec)
    if not atexit._ncallbacks():  # nothing before ours: it runs after every other exit handler
        atexit.register(exit_quickly)
    install_hooks(spec, _run.iterate)
    os.register_at_fork(after_in_child=_run.forked)
    return True


class _Run:
    """This process's loaders and their epochs."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec, self.exit_hooked = spec, False
        self.forked()

    def forked(self) -> None:
        """A new process (also what a fork's child starts with): no loader seen yet."""
        self.pid, self.lock = os.getpid(), threading.RLock()
        self.loaders: dict[int, tuple[weakref.ref[Any], LoaderState]] = {}
        self.order: list[LoaderState] = []

    def iterate(
        self, dl: Any, original: Callable[[Any], Any], layer: Callable[..., Any], source: bool
    ) -> Any:
        """``iter(dl)`` through ``layer``, a patched ``__iter__``: timed where ``layer`` is the one the script
        calls; ``source`` (torch's own) makes the batches, replayed in ingestion whichever layer is timed."""
        if os.getpid() != self.pid or _in_worker():
            return original(dl)
        called = time.perf_counter()
        try:
            with self.lock:
                state = self._state(dl)
                replay = replay_for(state, dl, self.spec) if source and state.mode == "ingestion" else None
                if type(dl).__iter__ is not layer or handing_out():  # a layer under the one the script calls
                    return original(dl) if replay is None else replay
                self._hold_handed_out(time.perf_counter())
                self._close(state, complete=False)  # a loop left early, or one held just now
                self._maybe_exit(state)
                before = read_counters(state.stats)
                expected = epoch_length(dl, self.spec.steps)
                meter = EpochMeter(
                    0.0, before, self._cuda(), expected, state.counts_tokens, state.room, state.id
                )
                if state.ended is not None:
                    events, end = state.ended
                    meter.before_start = transitions.since(events, state.id, began_after=end)
        except Exception as exc:
            say(f"cannot measure a DataLoader ({exc!r}); it runs unmeasured", key="iterate")
            return original(dl)
        meter.start, meter.called = time.perf_counter(), called
        inner = original(dl) if replay is None else replay
        state.open = meter
        ended = functools.partial(self._ended, state)
        return TimedIterator(inner, meter, self.spec.steps, ended, functools.partial(self._others_end, state))

    def _hold_handed_out(self, now: float) -> None:
        """Any loader's ``iter()`` at ``now`` ends the epochs that handed out all their batches: an
        evaluation loader's at once (its loop is over), the training loader's (the most batches so far) is
        held there: its epoch ends at the hold where its loop never asks for the batch past the end
        (Lightning's, at its own next ``iter()`` or the process's end), and goes on where the loop asks
        (an evaluation in a plain loop's last step: its StopIteration ends it, the evaluation inside)."""
        leading = self._leading()
        for state in self.order:
            if state is leading and state.open is not None:
                state.open.hold(now, functools.partial(read_counters, state.stats))
            elif state.open is not None and state.open.handed_out_all:
                self._close(state, True, state.open.end_at(now), seen_until=now)

    def _leading(self) -> LoaderState | None:
        """The loader with the most batches so far (ties: the first iterated): the training loader, as the
        analysis will take it."""
        return min(self.order, key=lambda s: (-s.total, s.order)) if self.order else None

    def _ahead(self, state: LoaderState) -> bool:
        """Whether ``state``'s loader has handed out more batches than any other so far (a tie, as between a
        validation's sanity check and the first training batches, says nothing)."""
        return all(state.total > other.total for other in self.order if other is not state)

    def _others_end(self, state: LoaderState, now: float) -> float:
        """Before a step of ``state``'s loader ends at ``now``: another loader's epoch begun inside the step
        that handed out all its batches (an evaluation every N steps that stops at ``len()``) ends, so the
        step knows that time as an evaluation, its recording included; returns the clock the step ends at."""
        began = state.open.last_return if state.open is not None else None
        nested = [s for s in self.order if s is not state and s.open and s.open.ended_in(began or now)]
        if not nested:  # most steps: no lock taken
            return now
        try:
            with self.lock:
                for other in nested:
                    if other.open is not None:
                        other.open.end_at(now)
                        self._close(other, True, nested=True)
        except Exception as exc:
            say(f"cannot record an epoch ({exc!r})", key="record")
        return time.perf_counter()

    def _state(self, dl: Any) -> LoaderState:
        key = id(dl)
        known = self.loaders.get(key)
        if known is not None and known[0]() is dl:
            return known[1]
        watch_optimizers()  # torch is imported: a DataLoader runs
        inner = getattr(dl, "base_dataloader", dl)  # the loader inside a framework's wrapper (accelerate)
        ours = derives_from(inner, "loader.dataloader", "DataLoader")
        settings = loader_settings(dl)
        shape = loader_shape(dl, settings)
        stats = inner.stats if ours else getattr(inner, GENERATED_STATS, None)
        counts_tokens, room = token_batches(inner)
        state = self._rebuilt(shape, dl.dataset) or LoaderState(
            id=f"{len(self.order)}:{type(dl.dataset).__name__}",
            order=len(self.order),
            loader_class="loader.DataLoader" if ours else "torch.utils.data.DataLoader",
            mode=self.spec.mode,
            settings=settings,
            stats=stats,
            serves_files=ours and getattr(inner, "cache_files", None) is not None,
            counts_tokens=counts_tokens,
            room=room,
            seen=counting_sampler(inner),
            over_network=stats is not None and any(map(in_object_storage, self.spec.data)),
            shape=shape,
            dataset_id=id(dl.dataset),
        )
        if state.order == len(self.order):
            self.order.append(state)
        self.loaders[key] = (weakref.ref(dl, functools.partial(self._forget, key)), state)
        if not self.exit_hooked:
            atexit.register(self._at_exit)  # registered after torch's own: runs before it tears workers down
            self.exit_hooked = True
        return state

    def _rebuilt(self, shape: tuple[Any, ...], dataset: Any) -> LoaderState | None:
        """The state of an earlier loader of ``shape``, not in an epoch now, that the new loader over
        ``dataset`` rebuilds: one the script no longer holds, or one over the same Dataset object (a
        framework may keep the loaders it rebuilt: accelerate's ``prepare`` keeps each). One still held over
        another Dataset is another loader of the same shape (a training and an evaluation loader of one
        class and batch size, without a length), never merged with it; a loader dropped but kept by a
        reference cycle is let go first (``gc.collect``, only where it decides)."""
        candidates = [s for s in self.order if s.shape == shape and s.open is None]
        if any(self._held(s) and s.dataset_id != id(dataset) for s in candidates):
            gc.collect()
        for state in candidates:
            if not self._held(state) or state.dataset_id == id(dataset):
                state.replay = None  # the batches of the loader it was (its Dataset may differ in content)
                state.dataset_id = id(dataset)
                return state
        return None

    def _held(self, state: LoaderState) -> bool:
        """Whether a loader of ``state`` is still alive in the script."""
        return any(held is state and ref() is not None for ref, held in self.loaders.values())

    def _forget(self, key: int, ref: weakref.ref[Any]) -> None:
        if self.loaders.get(key, (None,))[0] is ref:
            self.loaders.pop(key, None)

    def _cuda(self) -> Any:
        if not self.spec.sync_cuda:
            return None
        import torch

        return torch.cuda if torch.cuda.is_available() else None

    def _maybe_exit(self, state: LoaderState) -> None:
        """The training loader (most batches; ties: first iterated) has run its epochs: end the process."""
        epochs = self.spec.epochs
        if epochs is None or state.complete < epochs:
            return
        if self._leading() is not state:
            return
        self.close_all()
        say(f"the training loader {state.id} has run its {epochs} epochs: the process ends here (exit 0)")
        end_process()

    def _ended(self, state: LoaderState, meter: EpochMeter, end: float) -> None:
        try:
            with self.lock:
                if state.open is meter:
                    self._close(state, True, end)
        except Exception as exc:
            say(f"cannot record an epoch of {state.id} ({exc!r})", key="record")

    def close_all(self) -> None:
        self._hold_handed_out(time.perf_counter())
        for state in self.order:
            self._close(state, complete=False)

    def _at_exit(self) -> None:
        if os.getpid() != self.pid or not self.lock.acquire(timeout=5):
            return
        try:
            self.close_all()
        except Exception as exc:
            say(f"cannot record the last epochs ({exc!r})", key="record")
        finally:
            self.lock.release()

    def _close(
        self,
        state: LoaderState,
        complete: bool,
        end: float | None = None,
        seen_until: float | None = None,
        nested: bool = False,
    ) -> None:
        """End and record ``state``'s open epoch at ``end`` (None: its last activity); as the script saw it,
        at ``seen_until`` where another loader's call ended it (None: after the recording, in its own).
        ``nested``: it ran inside another loader's step, an evaluation however many batches it made."""
        meter = state.open
        if meter is None:
            return
        ended, span_end, after = transitions.reading(), seen_until, None
        if meter.held is not None:  # it handed out all its batches, and its loop went on elsewhere
            complete, (end, ended, after) = True, meter.held
            span_end = end
        state.open, meter.closed = None, True
        state.batches += meter.batches
        if not complete and meter.batches == 0:
            return  # an iterator made and never used: no epoch
        state.epochs += 1
        state.complete += complete
        after = read_counters(state.stats) if after is None else after
        end = end if end is not None else meter.last_activity
        record = epoch_record(state, meter, complete, end, after, self.spec.out_dir)
        write_record(self.spec.out_dir, record)
        span_end = time.perf_counter() if span_end is None else span_end
        if nested or not self._ahead(state):  # the training loader's epochs are no one's evaluation
            # as the script saw it: from its iter() to its end, the measuring at both ends included
            inside = transitions.since(meter.started, state.id, ended, began_after=meter.called)
            transitions.end_epoch(state.id, meter.called, span_end, inside)
        state.ended = (ended, span_end)
        if state.serves_files and record.batches and record.hits + record.misses == 0:
            say(
                f"{state.id} read no file under --data through open(): its reads cannot go through our cache "
                "(does its Dataset read with os.open, mmap or a C library, or files elsewhere?)",
                key=f"unserved-{state.id}",
            )


def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None
