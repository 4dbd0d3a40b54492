"""The what-if table (``stallbench.analysis.knobs``): every knob's predictions are a report field, filled
from the table, written to the JSON under the same name, described and typed in the published schema, and
drawn in the terminal table; one without predictions draws nothing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_report import make_report, pair  # noqa: F401  (pair: the fixture)
from test_whatif import measured

from stallbench.analysis.knobs import KNOBS, predicted
from stallbench.analysis.results import LoaderReport, PrefetchPrediction, RunRecord
from stallbench.report import report_to_json
from stallbench.report._schema import fields
from stallbench.report.table import DRAWN

SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "stallbench-report.schema.json"
GB = 10**9


@pytest.fixture
def ours(pair) -> LoaderReport:  # noqa: F811
    """Our loader's report, with a prediction for every knob."""
    depths = tuple(PrefetchPrediction(f, 9.25, "compute") for f in (1, 2, 4, 8))
    return dataclasses.replace(pair[1], prefetch_predictions=depths)


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_each_knob_is_a_report_field_written_typed_and_drawn(knob, ours):
    assert knob.name in {f.name for f in dataclasses.fields(LoaderReport)}
    assert getattr(ours, knob.name), f"the example report predicts nothing for {knob.name}"
    written = report_to_json([ours])["loaders"][0][knob.name]
    assert written == [dataclasses.asdict(p) for p in getattr(ours, knob.name)]
    published = json.loads(SCHEMA.read_text())["properties"]["loaders"]["items"]["properties"][knob.name]
    assert published["items"] == fields(knob.result) and published["description"] == knob.varies
    assert DRAWN[knob.name](ours, "")
    assert DRAWN[knob.name](dataclasses.replace(ours, **{knob.name: ()}), "") == []


def test_the_drawn_knobs_are_the_table_s():
    assert list(DRAWN) == [k.name for k in KNOBS]


def test_the_table_predicts_every_knob_from_one_measured_point():
    m = measured(loader="cached", workers=2, cores=2, t1=60.0, t2=100.0, prep_stall=40.0)
    cold = RunRecord("cold", (), "", cache_form="raw", cache_form_epochs={"raw": 100.0, "prepared": 70.0})
    got = predicted(m, cold)
    assert list(got) == [k.name for k in KNOBS]
    assert all(isinstance(p, k.result) for k in KNOBS for p in got[k.name])
    assert {p.form for p in got["form_predictions"]} == {"raw", "prepared"}
    assert got["predictions"] and got["prefetch_predictions"]
    assert make_report("torch", 15.25, 8.0, GB).nodes_predictions == ()  # torch's loader: no nodes what-if
