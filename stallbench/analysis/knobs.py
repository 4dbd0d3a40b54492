"""The what-if table: each setting whose effect an analysis predicts, one entry. An entry names its
predictions (the ``LoaderReport`` field and the JSON key, the same name), their type (the JSON schema reads
its fields), how they are predicted from what the runs measured, and what the setting varies.
``loader_report`` fills the report from the table, the JSON and its schema are written from it
(``stallbench.report``), and the terminal table draws each entry with the renderer named for it there.

A new knob: its predictions' type in ``results``, its prediction function, one entry here and one renderer
(``tests/test_knobs.py`` checks that every entry is filled, written, in the schema and drawn)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stallbench.analysis import nodes, whatif
from stallbench.analysis.results import (
    FormPrediction,
    NodesPrediction,
    Prediction,
    PrefetchPrediction,
    RunRecord,
)
from stallbench.analysis.whatif import Measured

__all__ = ["KNOBS", "Knob", "predicted"]


@dataclass(frozen=True)
class Knob:
    """One setting of the what-if."""

    name: str  # the LoaderReport field and the JSON key of its predictions
    result: type  # the type of one prediction
    predict: Callable[[Measured, RunRecord], tuple[Any, ...]]  # from the measured point and the cold run
    varies: str  # what it varies, as the JSON schema describes it


KNOBS: tuple[Knob, ...] = (
    Knob(
        "predictions",
        Prediction,
        lambda m, cold: whatif.what_if(m),
        "cache_bytes (1/4 to all of the dataset) and workers (1, 2, 4, 8); the measured point too",
    ),
    Knob(
        "prefetch_predictions",
        PrefetchPrediction,
        lambda m, cold: whatif.prefetch_what_if(m),
        "prefetch_factor (1, 2, 4, 8 and the measured one), at the measured workers and cache",
    ),
    Knob(
        "form_predictions",
        FormPrediction,
        whatif.form_what_if,
        "cache_form (raw, prepared, mixed) where our loader weighed the forms, at the measured cache",
    ),
    Knob(
        "nodes_predictions",
        NodesPrediction,
        lambda m, cold: nodes.nodes_what_if(m),
        "nodes (1, 2, 4, 8), the cache partitioned across them or independent; our loader only",
    ),
)


def predicted(m: Measured, cold: RunRecord) -> dict[str, tuple[Any, ...]]:
    """Every knob's predictions, by its name."""
    return {knob.name: knob.predict(m, cold) for knob in KNOBS}
