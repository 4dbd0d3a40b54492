"""``--apply``'s verdict: a run that lands near its prediction holds it, one that gained but missed says so,
and one no faster than as run contradicts the prediction, whatever it predicted."""

from __future__ import annotations

import pytest

from stallbench.analysis.apply import HOLDS, Applied


def applied(predicted: float, measured: float, as_run: float = 1.0, spread: float = 0.02) -> Applied:
    return Applied("4 workers", predicted, measured, as_run, spread)


def test_a_run_near_its_prediction_holds_it():
    said = applied(0.80, 0.84).said()
    assert said.startswith("4 workers: steady epoch predicted 0.80 s, measured 0.84 s (+5%), as run 1.00 s")
    assert said.endswith(f"the prediction holds (within {HOLDS:.0%})")


def test_a_run_that_gained_but_missed_its_prediction_says_both():
    said = applied(0.50, 0.80).said()
    assert "(+60%)" in said and said.endswith(
        f"off the prediction by more than {HOLDS:.0%}, yet 20% faster than as run"
    )


@pytest.mark.parametrize("measured", [1.00, 0.99, 1.30])  # level, within the spread, slower
def test_a_run_off_its_prediction_and_no_faster_than_as_run_contradicts_it(measured):
    said = applied(0.74, measured).said()
    assert said.endswith("the run contradicts the prediction (no faster than as run): keep it as run")
    assert "holds" not in said and "faster than as run," not in said


def test_a_run_near_a_prediction_of_a_gain_within_the_noise_says_so_not_that_it_contradicts():
    """A 3% gain predicted, measured within 2% of it: level with the run as analysed, within its spread."""
    said = applied(0.97, 0.99).said()
    assert said.endswith("within 15% of the prediction, but the gain is within the epochs' noise")
    assert "contradicts" not in said
