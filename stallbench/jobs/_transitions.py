"""The transitions of the user's process: time that is neither a training step nor waiting for its batches.

* an **evaluation**: an epoch of another loader, run inside a training loader's step (an evaluation every
  N steps) or between its epochs; counted at that epoch's end, as its whole span (``end_epoch``);
* a **checkpoint** write: each call of ``torch.save``, of safetensors' ``save_file``/``save_model`` and of the
  frameworks' own savers (Lightning's ``Trainer.save_checkpoint``, the Hugging Face Trainer's
  ``_save_checkpoint``, accelerate's ``save_state``: whole, the state gathered and the file written) made by
  the main thread (a background thread's overlaps the loop: no part of it), timed around the call, once its
  module is imported (``watched_modules``); one inside another is the outer's;
* a **phase** the script marks itself (``stallbench.profile``'s ``phase``: an evaluation, a checkpoint);
* a **compilation** by ``torch.compile``: its first calls and each recompile, timed by the start and end
  callbacks torch's compiler runs around the outermost compile (``torch._dynamo.callback``), registered once
  that module is imported (an optimizer imports it; a script without ``torch.compile`` makes none).

Each is an event: its kind, the loader whose epoch it is (none for a checkpoint), when it began and its
seconds. A meter takes a reading (how many events so far) and later asks ``since`` it for the events that
began after a moment (its step's start): only what ran inside the step is taken out of it, so an iterator
made long before (``next(iter(val))`` every N steps, a cycled one) is never charged to one step. A
transition is counted once: an evaluation's span is less the checkpoints written during it, and a loader's
own epochs are never its own transitions (``own``).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["end_epoch", "marked", "reading", "since", "watched_modules"]


class _Event(NamedTuple):
    kind: str
    source: str  # the loader whose epoch it is; "" for a checkpoint write
    began: float  # time.perf_counter()
    seconds: float


_events: list[_Event] = []  # appended whole (atomic under the GIL): read by slices, from any thread
_depth = threading.local()  # ``calls``: checkpoint calls under way in the thread (nested: the outer's)
_CHECKPOINT_WRITERS = {  # module: its writers, a method as "Class.method" (the frameworks' own, whole)
    "torch.serialization": ("save",),
    "safetensors.torch": ("save_file", "save_model"),
    "pytorch_lightning.trainer.trainer": ("Trainer.save_checkpoint",),
    "lightning.pytorch.trainer.trainer": ("Trainer.save_checkpoint",),
    "transformers.trainer": ("Trainer._save_checkpoint",),
    "accelerate.accelerator": ("Accelerator.save_state",),
}


def reading() -> int:
    """Where the events stand now."""
    return len(_events)


def since(
    before: int,
    own: str | None = None,
    until: int | None = None,
    began_after: float = float("-inf"),
    phases_of: str | None = None,
) -> dict[str, list[float]]:
    """Per kind, [seconds, count] of the events from reading ``before`` to ``until`` (default: now) that
    began after ``began_after``, less the epochs of loader ``own``, and with ``phases_of`` (a profile's
    meter) less the phases another profile marked."""
    spent: dict[str, list[float]] = {}
    for event in _events[before:until]:
        theirs = phases_of is not None and event.kind == "phase" and event.source != phases_of
        if event.began >= began_after and not (own is not None and event.source == own) and not theirs:
            total = spent.setdefault(event.kind, [0.0, 0])
            total[0] += event.seconds
            total[1] += 1
    return spent


def end_epoch(source: str, start: float, end: float, inside: dict[str, list[float]]) -> None:
    """An epoch of loader ``source`` ran from ``start`` to ``end``: an evaluation to another loader whose step
    or gap between epochs it began in, less what it counted itself (``inside``: the checkpoints it wrote)."""
    seconds = end - start - sum(seconds for seconds, _ in inside.values())
    _events.append(_Event("evaluation", source, start, max(0.0, seconds)))


def marked(source: str, began: float, end: float, inside: int) -> None:
    """A phase the script marked itself (``stallbench.profile``'s, named ``source`` by its profile) from
    ``began`` to ``end``, less what was counted in it since reading ``inside`` (a checkpoint it wrote): each
    moment is one transition's, as an evaluation's."""
    counted = sum(seconds for seconds, _ in since(inside, began_after=began).values())
    _events.append(_Event("phase", source, began, max(0.0, end - began - counted)))


def watched_modules() -> dict[str, Callable[[Any], None]]:
    """The modules whose transitions are timed, each with what times them once it is imported
    (``torch.save`` is looked up in ``torch`` at each call, and safetensors' writers are taken by name right
    after their module is imported: both then call the timed one)."""
    return {**dict.fromkeys(_CHECKPOINT_WRITERS, _writers_imported), _COMPILER: _compiler_imported}


def _writers_imported(module: Any) -> None:
    for name in _CHECKPOINT_WRITERS[module.__name__]:
        _time_writer(module, name)


_COMPILER = "torch._dynamo.callback"
_compiling = threading.local()  # ``began``: when the main thread's outermost compile began


def _compiler_imported(module: Any) -> None:
    """Register the compile callbacks, and again after each ``torch._dynamo.reset()`` (which clears every
    callback the handler holds)."""
    handler = module.callback_handler
    _watch_compiles(handler)
    clear = handler.clear

    def clear_then_watch(*args: Any, **kwargs: Any) -> Any:
        try:
            return clear(*args, **kwargs)
        finally:
            _watch_compiles(handler)

    handler.clear = clear_then_watch


def _watch_compiles(handler: Any) -> None:
    if _compile_started not in handler.start_callbacks:
        handler.register_start_callback(_compile_started)
        handler.register_end_callback(_compile_ended)


def _compile_started(*args: Any) -> None:
    """torch runs it unguarded (with a ``CallbackArgs`` since 2.8, with none before): it never raises."""
    try:
        if threading.current_thread() is threading.main_thread():
            _compiling.began = time.perf_counter()
    except Exception:
        return


def _compile_ended(*args: Any) -> None:
    try:
        began = getattr(_compiling, "began", None)
        if began is not None and threading.current_thread() is threading.main_thread():
            _compiling.began = None
            _events.append(_Event("compilation", "", began, time.perf_counter() - began))
    except Exception:
        return


def _time_writer(module: Any, dotted: str) -> None:
    owner_name, _, name = dotted.rpartition(".")
    owner = getattr(module, owner_name, None) if owner_name else module
    writer = getattr(owner, name, None) if owner is not None else None
    if writer is None or getattr(writer, "__stallbench__", False):
        return

    @functools.wraps(writer)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return writer(*args, **kwargs)
        start = time.perf_counter()
        depth = getattr(_depth, "calls", 0)
        _depth.calls = depth + 1
        try:
            return writer(*args, **kwargs)
        finally:
            _depth.calls = depth
            if depth == 0:
                _events.append(_Event("checkpoint", "", start, time.perf_counter() - start))

    timed.__stallbench__ = True  # type: ignore[attr-defined]
    setattr(owner, name, timed)
    if module.__name__ == "torch.serialization":
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, name, None) is writer:
            setattr(torch, name, timed)
