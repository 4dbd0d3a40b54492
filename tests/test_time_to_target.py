"""stallbench.time_to_target: MLPerf's clock, run through evaluation, on a deterministic fake run."""

from __future__ import annotations

import itertools

import pytest

from stallbench import time_to_target


class FakeRun:
    """Each epoch takes 10 s of a fake clock and makes 5 updates; each evaluation 2 s, giving ``values``."""

    def __init__(self, values: list[float]) -> None:
        self.now, self.values, self.evaluations = 0.0, iter(values), 0

    def clock(self) -> float:
        return self.now

    def train_epoch(self) -> int:
        self.now += 10
        return 5

    def evaluate(self) -> float:
        self.now += 2
        self.evaluations += 1
        return next(self.values)


def _run(values: list[float], target: float, **options) -> tuple:
    run = FakeRun(values)
    result = time_to_target(run.train_epoch, run.evaluate, target, clock=run.clock, **options)
    return result, run


def test_the_clock_stops_after_the_evaluation_that_reaches_the_target():
    result, run = _run([3.0, 2.0, 0.9, 0.5], target=1.0, max_epochs=10)
    assert result.reached and result.epochs == 3 and result.updates == 15
    assert result.seconds == 36.0  # three epochs and three evaluations: the evaluations count
    assert result.value == 0.9 and run.evaluations == 3
    assert result.history == ((12.0, 3.0), (24.0, 2.0), (36.0, 0.9))
    assert "target 1 reached: 0.9 after 3 epochs, 15 updates, 36.00 s" in result.summary()


def test_higher_is_better_for_an_accuracy():
    result, _ = _run([0.5, 0.8, 0.76], target=0.75, max_epochs=5, higher_is_better=True)
    assert result.reached and result.epochs == 2 and result.seconds == 24.0


def test_not_reached_runs_every_epoch_and_says_so():
    result, run = _run([3.0, 2.0, 1.5], target=1.0, max_epochs=3)
    assert not result.reached and result.epochs == 3 and result.seconds == 36.0 and run.evaluations == 3
    assert result.summary().startswith("target 1 not reached: 1.5 after 3 epochs")


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_max_epochs_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="max_epochs"):
        time_to_target(lambda: 1, lambda: 0.0, 1.0, max_epochs=bad)


@pytest.mark.parametrize("made", [None, -1, 1.5])
def test_train_epoch_must_return_its_updates(made):
    with pytest.raises(ValueError, match="optimizer updates"):
        time_to_target(lambda: made, itertools.repeat(0.0).__next__, 1.0, max_epochs=2)
