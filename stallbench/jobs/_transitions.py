"""The transitions of the user's process: time that is neither a training step nor waiting for its batches.

* an **evaluation**: an epoch of another loader, run inside a training loader's step (an evaluation every
  N steps) or between its epochs; counted at that epoch's end, as its whole span (``end_epoch``);
* a **checkpoint** write: each call of ``torch.save`` and of safetensors' ``save_file``/``save_model``,
  timed around the call, once its module is imported (``checkpoint_modules``).

Each kind is a running total of seconds and a count, per process; a meter takes a reading (``reading``) and
later the change since (``since``): the part of a step spent in transitions is taken out of the step and
named. A transition is counted once, in the outermost: a checkpoint written inside an evaluation is the
evaluation's, and an evaluation's span is not the evaluating loader's own (``source``: the loader whose epoch
it is, left out of that loader's own readings).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["KINDS", "checkpoint_modules", "end_epoch", "reading", "since"]

KINDS = ("evaluation", "checkpoint")
Reading = dict[tuple[str, str], list[float]]  # (kind, source) -> [seconds, count]

_totals: Reading = {}
_changes = [0]  # transitions counted so far in this process: a reading unchanged since is not looked into
_depth = [0]  # timed checkpoint calls under way (one inside another is the outer's)
_CHECKPOINT_WRITERS = {
    "torch.serialization": ("save",),
    "safetensors.torch": ("save_file", "save_model"),
}


def reading() -> tuple[int, Reading]:
    """Every running total now (with how many transitions were counted, the cheap test of ``since``)."""
    return _changes[0], {key: list(value) for key, value in _totals.items()}


def since(
    before: tuple[int, Reading], own: str | None = None, until: tuple[int, Reading] | None = None
) -> dict[str, list[float]]:
    """Per kind, [seconds, count] spent since ``before`` (until the reading ``until``; default: now), less
    the epochs of loader ``own``."""
    spent: dict[str, list[float]] = {}
    changes, before_totals = before
    until_changes, totals = until if until is not None else (_changes[0], _totals)
    if changes == until_changes:
        return spent
    for (kind, source), (seconds, count) in totals.items():
        if source == own and own is not None:
            continue
        was = before_totals.get((kind, source), [0.0, 0])
        if count > was[1]:
            total = spent.setdefault(kind, [0.0, 0])
            total[0] += seconds - was[0]
            total[1] += int(count - was[1])
    return spent


def end_epoch(source: str, start: float, end: float, inside: dict[str, list[float]]) -> None:
    """An epoch of loader ``source`` ran from ``start`` to ``end``: an evaluation to every other loader that
    was in a step meanwhile, less what it counted itself (``inside``: the transitions it ran)."""
    seconds = end - start - sum(seconds for seconds, _ in inside.values())
    _add(("evaluation", source), max(0.0, seconds))


def checkpoint_modules() -> dict[str, Callable[[Any], None]]:
    """The modules whose checkpoint writers are timed, each with what times them once it is imported
    (``torch.save`` is looked up in ``torch`` at each call, and safetensors' writers are taken by name right
    after their module is imported: both then call the timed one)."""
    return dict.fromkeys(_CHECKPOINT_WRITERS, _module_imported)


def _module_imported(module: Any) -> None:
    for name in _CHECKPOINT_WRITERS[module.__name__]:
        _time_writer(module, name)


def _time_writer(module: Any, name: str) -> None:
    writer = getattr(module, name, None)
    if writer is None or getattr(writer, "__stallbench__", False):
        return

    @functools.wraps(writer)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        _depth[0] += 1
        try:
            return writer(*args, **kwargs)
        finally:
            _depth[0] -= 1
            if _depth[0] == 0:
                _add(("checkpoint", ""), time.perf_counter() - start)

    timed.__stallbench__ = True  # type: ignore[attr-defined]
    setattr(module, name, timed)
    if module.__name__ == "torch.serialization":
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, name, None) is writer:
            setattr(torch, name, timed)


def _add(key: tuple[str, str], seconds: float) -> None:
    _changes[0] += 1
    total = _totals.setdefault(key, [0.0, 0])
    total[0] += seconds
    total[1] += 1
