"""Time to a quality target, MLPerf's measure of a training run: wall time from the start of training to the
first evaluation that reaches the target, the evaluations' own time included (the clock never stops).

A faster loader is only useful if it gets the model to the same quality sooner; packing, for one, changes the
updates per epoch and what each sees. ``time_to_target`` runs your epochs and evaluations and says when; run
under ``stallbench analyze|compare -- COMMAND``, it also tells the report, which shows it per loader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from stallbench._words import counted
from stallbench.jobs.spec import JobSpec, target_path

__all__ = ["TargetResult", "time_to_target"]


@dataclass(frozen=True)
class TargetResult:
    """How a run went against its target. ``seconds``, ``epochs`` and ``updates`` run to the evaluation that
    reached it, or to the end of the last epoch's evaluation when none did (``reached`` False)."""

    target: float
    reached: bool
    seconds: float
    epochs: int
    updates: int
    value: float  # that evaluation's result
    history: tuple[tuple[float, float], ...]  # (seconds since the start, value) after each epoch

    def summary(self) -> str:
        where = f"{counted(self.epochs, 'epoch')}, {counted(self.updates, 'update')}, {self.seconds:.2f} s"
        where += " (evaluation included)"
        if self.reached:
            return f"target {self.target:g} reached: {self.value:g} after {where}"
        return f"target {self.target:g} not reached: {self.value:g} after {where}"


def _reached(value: float, target: float, higher_is_better: bool) -> bool:
    return value >= target if higher_is_better else value <= target


def _updates(made: object) -> int:
    if isinstance(made, bool) or not isinstance(made, int) or made < 0:
        raise ValueError(f"train_epoch must return the optimizer updates it made (an int >= 0), got {made!r}")
    return made


def time_to_target(
    train_epoch: Callable[[], int],
    evaluate: Callable[[], float],
    target: float,
    *,
    max_epochs: int,
    higher_is_better: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> TargetResult:
    """Alternate ``train_epoch()`` (returns the optimizer updates it made) and ``evaluate()`` (returns the
    quality: a loss by default, an accuracy with ``higher_is_better``) until the target is reached or
    ``max_epochs`` are done. The clock starts before the first epoch and stops after the evaluation that
    reached the target."""
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
        raise ValueError(f"max_epochs must be a positive int, got {max_epochs!r}")
    start, updates, history = clock(), 0, []
    for epoch in range(1, max_epochs + 1):
        updates += _updates(train_epoch())
        value = float(evaluate())
        history.append((clock() - start, value))
        if _reached(value, target, higher_is_better) or epoch == max_epochs:
            break
    reached = _reached(value, target, higher_is_better)
    result = TargetResult(target, reached, history[-1][0], epoch, updates, value, tuple(history))
    _tell_stallbench(result)
    return result


def _tell_stallbench(result: TargetResult) -> None:
    """Under ``stallbench analyze|compare -- COMMAND``, leave the result for the report (one JSON line in
    the run's folder); elsewhere nothing."""
    spec = JobSpec.from_env()
    if spec is not None and spec.out_dir:
        with open(target_path(spec.out_dir, int(os.environ.get("RANK", "0")), os.getpid()), "a") as out:
            out.write(json.dumps(dataclasses.asdict(result)) + "\n")
