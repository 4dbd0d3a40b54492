"""stallbench.report: the table holds the numbers, the JSON holds its schema, the plot is a PNG."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from stallbench.analysis.results import (
    SCHEMA,
    Breakdown,
    EpochRecord,
    FormPrediction,
    LoaderReport,
    Machine,
    NodesPrediction,
    Prediction,
    Roofline,
    RunRecord,
    Workload,
)
from stallbench.analysis.work import useful_work
from stallbench.report import (
    REPORT_SCHEMA,
    format_report,
    report_to_json,
    validate_report_json,
    write_json,
    write_plot,
)
from stallbench.report.concurrent import CONCURRENT_JSON_SCHEMA
from stallbench.report.output_schemas import PROFILE_SCHEMA, SIMULATE_SCHEMA

DOC = Path(__file__).resolve().parent.parent / "docs" / "stallbench-json.md"
CONCURRENT_SECTION = "\n## `compare --jobs N`"
GB = 10**9
WORKLOAD = Workload(
    "/data/imagenet-subset", 2 * GB, 2 * GB * 6 // 8, 20_000, 64, 4, "emulated:20", 3, GB, 200e6, 3 * GB // 2
)


def _timeline(n: int, wait: float, seed: int) -> tuple[tuple[float, float], ...]:
    rng = random.Random(seed)
    return tuple((2.0 if i == 0 else wait * rng.uniform(0.2, 1.8), 0.02) for i in range(n))


def _run(phase: str, seconds: float, storage: int, wait: float = 0.0) -> RunRecord:
    epochs = tuple(
        EpochRecord(e, seconds, seconds * 0.4, seconds * 0.6, 0.8, 313, 20_000, storage, 100, 50, 30.5)
        for e in range(3)
    )
    stages = {"fetch": seconds, "decode": 2 * seconds, "collate": 0.1} if phase == "cold" else {}
    timeline = _timeline(313, wait, len(phase)) if phase == "cold" else ()
    return RunRecord(phase, epochs, f"{phase} condition", stages, timeline)


def make_report(loader: str, epoch: float, fetch: float, storage: int, **changes) -> LoaderReport:
    """A report whose steady epoch is compute 6.25 s + prep 1.0 s + ``fetch``; other fields plausible."""
    runs = (_run("ingestion", 6.25, 0), _run("prep", 7.25, 0), _run("cold", epoch, storage, fetch / 313))
    predictions = tuple(
        Prediction(c, w, 6.25 + fetch * (1 - c / (2 * GB)) * 4 / w, "fetch" if c < GB else "compute")
        for c in (0, GB // 2, GB)
        for w in (2, 4, 8)
    )
    report = LoaderReport(
        loader=loader,
        workload=WORKLOAD,
        runs=runs,
        breakdown=Breakdown(epoch, 6.25, 1.0, fetch, 3.5, step_alone_seconds=6.25, warm_epoch_seconds=7.25),
        storage_bytes=storage,
        dataset_bytes=2 * GB,
        record_bytes=2 * GB * 6 // 8,
        hit_rate=1 - storage / (2 * GB),
        cpu_utilisation=0.42,
        samples_per_s=20_000 / epoch,
        machine=Machine(16, 1.8e9, 20e9, 620.0),
        roofline=Roofline(6.25, 2.1, storage / 200e6, "compute", min(1.0, 6.25 / epoch), 6.25 / epoch),
        predictions=predictions,
        advice=f"{loader}: fetch-bound; a cache of 1.5 GB would make the epoch compute-bound.",
        useful=useful_work(runs[-1].epochs[1:]),
    )
    return dataclasses.replace(report, **changes)


@pytest.fixture
def pair() -> tuple[LoaderReport, LoaderReport]:
    forms = (FormPrediction("raw", 9.25, True), FormPrediction("prepared", 4.5, False))
    # D = 2 GB on the device, 1.5 GB of records, C = 1 GB: partitioned max(0, 1 - N C / 1.5 GB) of 2 GB,
    # independent (1 - 1 / 1.5) of 2 GB = 666.67 MB whatever N; 2 nodes read 12% of the remote from storage
    third = 2 * GB // 3
    nodes = (
        NodesPrediction(1, third, third, third, third, 9.25, 9.25, 0.0, 9.25),
        NodesPrediction(2, 40 * 10**6, 20 * 10**6, third, round(third / 2), 5.5, 9.25, 0.12, 6.0),
        NodesPrediction(4, 0, 0, third, round(third / 4), 3.0, 9.25, 0.0, 3.0),
        NodesPrediction(8, 0, 0, third, round(third / 8), 1.5, 9.25, 0.0, 1.5),
    )
    cached = make_report("cached", 9.25, 2.0, GB, nodes_predictions=nodes, form_predictions=forms)
    return make_report("torch", 15.25, 8.0, 3 * GB // 2), cached


def test_single_table_holds_the_numbers():
    text = format_report([make_report("torch", 15.25, 8.0, 3 * GB // 2)])
    for needed in ("/data/imagenet-subset", "15.25 s", "6.25 s (41.0%)", "1.00 s (6.6%)", "8.00 s (52.5%)"):
        assert needed in text
    for needed in ("3.50 s", "1.50 GB", "75.0%", "25.0%", "42.0%", "1,311", "16", "1.80 GB/s", "620"):
        assert needed in text
    assert "fetch" in text and "decode" in text and "collate" in text
    assert "what-if" in text and "*10.25 s compute" in text and "advice: torch: fetch-bound" in text
    assert "vs" not in text.split("advice")[0]
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "\x1b" not in text


def test_table_shows_device_bytes_with_record_bytes_beside():
    words = " ".join(format_report([make_report("torch", 15.25, 8.0, 3 * GB // 2)]).split())
    assert "2.00 GB on the device (1.50 GB of records), 20,000 samples" in words
    assert "storage read 1.50 GB of the dataset 75.0%" in words  # device bytes over device bytes


def _efficiency_row(report: LoaderReport) -> str:
    return next(line for line in format_report([report]).splitlines() if "efficiency" in line)


def test_efficiency_above_the_epoch_is_capped_and_says_by_how_much():
    report = make_report("torch", 15.25, 8.0, GB)
    over = dataclasses.replace(report.roofline, efficiency=1.0, bound_ratio=1.023)
    assert _efficiency_row(dataclasses.replace(report, roofline=over)).endswith(
        "100.0% (measured bound 2.3% above the epoch)"
    )
    assert _efficiency_row(report).split()[-1] == "41.0%"  # 6.25 / 15.25, below the epoch: as it is


def test_compare_table_side_by_side_with_ratios(pair):
    text = format_report(pair)
    header = next(line for line in text.splitlines() if "cached vs torch" in line)
    assert header.index("torch") < header.index("cached") < header.index("cached vs torch")
    assert "1.65x faster" in text  # 15.25 / 9.25
    assert "-6.00 s" in text  # fetch stall 8 s -> 2 s
    assert "-33%" in text  # storage 1.5 GB -> 1 GB
    assert "advice (torch)" in text and "advice (cached)" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_nodes_what_if_lines_are_the_cached_loaders_only(pair):
    text = format_report(pair)
    torch_part, cached_part = text.split("advice (torch)")
    assert "nodes what-if" not in torch_part  # torch's loader has no partitioned cache
    lines = cached_part.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("nodes what-if (cached)"))
    top = next(i for i in range(head, len(lines)) if lines[i].split()[:2] == ["nodes", "partitioned"])
    assert " ".join(" ".join(lines[head:top]).split()) == (
        "nodes what-if (cached): predicted steady epoch, N nodes with 1.00 GB of cache each sharing the "
        "storage; partitioned (partition_cache=True; split: remote records read from storage) or independent"
    )
    header = [
        "nodes",
        "partitioned",
        "storage",
        "per",
        "node",
        "split",
        "independent",
        "storage",
        "per",
        "node",
    ]
    assert lines[top].split() == header
    assert lines[top + 1].split() == ["1", "9.25", "s", "666.67", "MB", "666.67", "MB", "0.0%", "9.25", "s",
                                       "666.67", "MB", "666.67", "MB"]  # fmt: skip
    assert lines[top + 2].split() == ["2", "5.50", "s", "40.00", "MB", "20.00", "MB", "12.0%", "9.25", "s",
                                       "666.67", "MB", "333.33", "MB"]  # fmt: skip
    assert lines[top + 4].split()[:4] == ["8", "1.50", "s", "0"]


def test_the_form_what_if_is_the_cached_loaders_one_line_with_the_form_run_starred(pair):
    torch_part, cached_part = format_report(pair).split("advice (torch)")
    assert "cache_form" not in torch_part
    line = next(line for line in cached_part.splitlines() if "cache_form" in line)
    assert line.startswith("  cache_form *raw: 9.25 s, prepared: 4.50 s (the loader's own weighing")


def test_a_difference_within_the_spreads_is_noise_the_headline_ratio_included(pair):
    def row(reports, label: str) -> str:
        return next(line for line in format_report(reports).splitlines() if line.startswith(f"  {label}"))

    assert row(pair, "prep stall").endswith(" within noise")  # both 1.00 s
    slower = dataclasses.replace(
        pair[1],
        breakdown=Breakdown(9.75, 6.25, 1.5, 2.0, 3.5, step_alone_seconds=6.25, warm_epoch_seconds=7.75),
    )
    assert row([pair[0], slower], "prep stall").endswith(" +0.50 s")
    for spread, said in ((0.45, " +0.50 s"), (0.5, " within noise")):  # 0.5 s against 0 + the spread
        noisy = dataclasses.replace(
            slower, breakdown=dataclasses.replace(slower.breakdown, prep_stall_spread_seconds=spread)
        )
        assert f"1.50 s (15.4%) ± {spread:.2f}" in row([pair[0], noisy], "prep stall")
        assert row([pair[0], noisy], "prep stall").endswith(said)
    assert row(pair, "epoch time").endswith("1.65x faster")
    both = [
        dataclasses.replace(r, breakdown=dataclasses.replace(r.breakdown, epoch_spread_seconds=3.0))
        for r in pair
    ]
    assert row(both, "epoch time").endswith(" within noise")  # 15.25 vs 9.25 s, each ± 3.0


def test_the_headline_carries_the_range_its_spreads_allow(pair):
    spread = [
        dataclasses.replace(r, breakdown=dataclasses.replace(r.breakdown, epoch_spread_seconds=0.5))
        for r in pair
    ]
    headline = [line for line in format_report(spread).splitlines() if line.startswith("  epoch time")][-1]
    assert headline.endswith("1.65x faster (1.51-1.80)")  # 14.75 / 9.75 to 15.75 / 8.75 (a block of its own)


@pytest.mark.parametrize(
    ("step_alone", "said"), [(7.5, "1.65x faster"), (8.0, "busy machine, not comparable")]
)
def test_a_headline_whose_steps_alone_moved_is_not_compared(pair, step_alone, said):
    """The ingestion run's steps do not depend on the loader: 25% apart, the load changed between columns."""
    moved = dataclasses.replace(
        pair[1], breakdown=dataclasses.replace(pair[1].breakdown, step_alone_seconds=step_alone)
    )
    text = format_report([pair[0], moved])
    assert [line for line in text.splitlines() if line.startswith("  epoch time")][-1].endswith(said)


@pytest.mark.parametrize(
    ("step_alone", "said"), [(7.75, "1.65x faster"), (8.0, "busy machine, not comparable")]
)
def test_a_headline_whose_steps_ran_faster_beside_the_loader_than_alone_is_not_compared(
    pair, step_alone, said
):
    """Both columns' steps alone slowed alike (a burner in both ingestion runs), one cold run quiet: its
    compute (6.25 s) 25% below its steps alone; a loader only slows the step, so the load left that column."""
    slowed = [
        dataclasses.replace(r, breakdown=dataclasses.replace(r.breakdown, step_alone_seconds=step_alone))
        for r in pair
    ]
    text = format_report(slowed)
    assert [line for line in text.splitlines() if line.startswith("  epoch time")][-1].endswith(said)
    noisy = [  # compute's own spread covers the gap: noise, compared as it is
        dataclasses.replace(r, breakdown=dataclasses.replace(r.breakdown, compute_spread_seconds=2.0))
        for r in slowed
    ]
    assert [line for line in format_report(noisy).splitlines() if "epoch time" in line][-1].endswith("faster")


def test_wide_compare_wraps_to_100_columns(pair):
    reports = [*pair, make_report("partitioned", 8.0, 0.75, GB // 2), make_report("other", 9.0, 1.75, GB)]
    text = format_report(reports)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "other vs torch" in text


def test_table_without_a_cache_budget_marks_nothing():
    workload = dataclasses.replace(WORKLOAD, cache_bytes=None, storage_bandwidth=None, memory_limit=None)
    text = format_report([make_report("torch", 15.25, 8.0, GB, workload=workload)])
    words = " ".join(text.split())
    assert "the memory available" in words and "not throttled" in words and "not limited" in words
    assert "*" not in text.split("what-if")[1].split("advice")[0].replace("(* = as run)", "")


def test_not_finite_numbers_print_as_dash():
    text = format_report([make_report("torch", 15.25, 8.0, GB, hit_rate=math.nan)])
    assert "nan" not in text.lower()


@pytest.mark.parametrize(
    ("reports", "match"),
    [([], "at least one"), ("twice", "must differ"), ("other", "another workload")],
)
def test_bad_reports_are_refused(pair, reports, match):
    if reports == "twice":
        reports = [pair[0], pair[0]]
    elif reports == "other":
        reports = [pair[0], dataclasses.replace(pair[1], workload=dataclasses.replace(WORKLOAD, workers=8))]
    with pytest.raises(ValueError, match=match):
        format_report(reports)


def _roundtrip(obj: dict) -> dict:
    return json.loads(json.dumps(obj, allow_nan=False))


def test_json_round_trip_holds_the_schema(pair):
    obj = _roundtrip(report_to_json(pair))
    validate_report_json(obj)
    assert obj["schema"] == SCHEMA == "stallbench.report/7"
    assert [entry["loader"] for entry in obj["loaders"]] == ["torch", "cached"]
    torch, cached = obj["loaders"]
    assert torch["fetch_stall_seconds"] == 8.0 and torch["fetch_stall_percent"] == pytest.approx(52.459, 1e-3)
    assert cached["storage_bytes"] == GB and cached["machine"]["cores"] == 16
    assert [run["phase"] for run in cached["runs"]] == ["ingestion", "prep", "cold"]
    assert cached["runs"][2]["stage_seconds"] == {"fetch": 9.25, "decode": 18.5, "collate": 0.1}
    assert len(cached["runs"][2]["epochs"]) == 3 and len(cached["predictions"]) == 9
    assert torch["nodes_predictions"] == []
    assert [n["nodes"] for n in cached["nodes_predictions"]] == [1, 2, 4, 8]
    assert cached["nodes_predictions"][1] == {
        "nodes": 2,
        "partitioned_storage_bytes": 40_000_000,
        "partitioned_storage_bytes_per_node": 20_000_000,
        "independent_storage_bytes": 666_666_666,
        "independent_storage_bytes_per_node": 333_333_333,
        "partitioned_epoch_seconds": 5.5,
        "independent_epoch_seconds": 9.25,
        "storage_share": 0.12,
        "peers_only_epoch_seconds": 6.0,
    }
    ratios = obj["ratios_to_baseline"]
    assert set(ratios) == {"cached"}
    assert ratios["cached"]["epoch_seconds"] == pytest.approx(9.25 / 15.25)
    assert ratios["cached"]["fetch_stall_seconds"] == pytest.approx(0.25)
    assert ratios["cached"]["storage_bytes"] == pytest.approx(2 / 3)
    assert obj["workload"]["cache_bytes"] == GB


def test_json_has_null_not_nan():
    base = make_report("torch", 15.25, 0.0, 0, hit_rate=math.nan)
    obj = report_to_json([base, make_report("cached", 9.25, 0.0, 0, samples_per_s=math.inf)])
    assert obj["loaders"][0]["hit_rate"] is None and obj["loaders"][1]["samples_per_s"] is None
    assert obj["ratios_to_baseline"]["cached"]["storage_bytes"] is None  # baseline read nothing
    validate_report_json(_roundtrip(obj))


def test_single_loader_json_has_no_ratios():
    obj = _roundtrip(report_to_json([make_report("torch", 15.25, 8.0, GB)]))
    validate_report_json(obj)
    assert obj["ratios_to_baseline"] == {}


def _set(obj: dict, path: tuple, value=None, delete: bool = False) -> dict:
    broken = copy.deepcopy(obj)
    *parents, last = path
    target = broken
    for key in parents:
        target = target[key]
    if delete:
        del target[last]
    else:
        target[last] = value
    return broken


@pytest.mark.parametrize(
    ("path", "value", "delete", "named"),
    [
        (("workload",), None, True, "workload is missing"),
        (("loaders", 0, "machine", "cores"), None, True, "loaders[0].machine.cores is missing"),
        (("loaders", 1, "epoch_seconds"), "fast", False, "loaders[1].epoch_seconds must be number|null"),
        (("loaders", 0, "storage_bytes"), 1.5, False, "loaders[0].storage_bytes must be integer"),
        (("loaders", 0, "runs", 2, "epochs", 0, "hits"), True, False, "runs[2].epochs[0].hits"),
        (("loaders", 0, "runs", 2, "stage_seconds", "fetch"), "1", False, "stage_seconds.fetch"),
        (("loaders", 1, "predictions"), {}, False, "loaders[1].predictions must be list"),
        (("ratios_to_baseline", "cached", "storage_bytes"), [], False, "cached.storage_bytes"),
        (("schema",), "stallbench.report/1", False, "schema must be 'stallbench.report/7'"),
        (("loaders", 0, "record_bytes"), None, True, "loaders[0].record_bytes is missing"),
        (("workload", "record_bytes"), 1.5, False, "workload.record_bytes must be integer"),
        (("loaders", 1, "roofline", "bound_ratio"), None, True, "loaders[1].roofline.bound_ratio is missing"),
        (("loaders",), [], False, "at least one loader"),
    ],
)
def test_broken_json_is_named(pair, path, value, delete, named):
    obj = _roundtrip(report_to_json(pair))
    with pytest.raises(ValueError, match=re.escape(named)):
        validate_report_json(_set(obj, path, value, delete))


def test_validate_refuses_a_non_object():
    with pytest.raises(ValueError, match="the report must be dict"):
        validate_report_json([])


def test_write_json_is_atomic_and_valid(pair, tmp_path):
    path = write_json(pair, tmp_path / "report.json")
    validate_report_json(json.loads(path.read_text()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary left


def test_write_plot_is_a_png(pair, tmp_path):
    path = write_plot(pair, tmp_path / "report.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.png"]


def test_write_plot_without_timelines(tmp_path):
    report = make_report("torch", 15.25, 8.0, GB)
    report = dataclasses.replace(report, runs=tuple(dataclasses.replace(r, timeline=()) for r in report.runs))
    assert write_plot([report], tmp_path / "one.PNG").read_bytes()[:4] == b"\x89PNG"


def test_import_leaves_matplotlib_out():
    code = "import sys, stallbench.report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "False\n"


def test_write_plot_refuses_other_suffixes(pair, tmp_path):
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "plot.pdf"))):
        write_plot(pair, tmp_path / "plot.pdf")
    assert not list(tmp_path.iterdir())


def _keys(obj: object, skip_free: bool = False) -> set[str]:
    """Every key of a JSON value, less the free ones (loader and stage names)."""
    if isinstance(obj, list):
        return set().union(*(_keys(item) for item in obj))
    if not isinstance(obj, dict):
        return set()
    found = set() if skip_free else set(obj)
    for key, value in obj.items():
        free = (
            "ratios_to_baseline",
            "stage_seconds",
            "transitions",
            "transitions_between",
            "transitions_before",
            "warmup_transitions",
        )
        found |= _keys(value, skip_free=key in free)
    return found


def test_every_key_is_documented(pair):
    report_part = DOC.read_text().split(CONCURRENT_SECTION)[0]  # compare --jobs has its own object after it
    documented = set(re.findall(r"^\| `(\w+)` \|", report_part, flags=re.M))
    assert _keys(report_to_json(pair)) == documented


def test_doc_example_runs(pair, tmp_path, monkeypatch, capsys):
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    write_json(pair, tmp_path / "report.json")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(DOC), "exec"), {})
    assert capsys.readouterr().out == "cached: 1.65x the speed of torch\n"


@pytest.mark.parametrize(
    ("published", "schema"),
    [
        ("stallbench-report.schema.json", REPORT_SCHEMA),
        ("stallbench-concurrent.schema.json", CONCURRENT_JSON_SCHEMA),
        ("stallbench-profile.schema.json", PROFILE_SCHEMA),
        ("stallbench-simulate.schema.json", SIMULATE_SCHEMA),
    ],
)
def test_the_published_schemas_are_the_ones_checked(published, schema):
    """docs/ holds each JSON Schema as the code checks it: a reader validates with any JSON Schema tool."""
    assert json.loads((DOC.parent / published).read_text()) == schema
    jsonschema.Draft202012Validator.check_schema(schema)


def test_a_report_validates_against_the_published_schema_with_jsonschema_itself(pair):
    schema = json.loads((DOC.parent / "stallbench-report.schema.json").read_text())
    jsonschema.validate(_roundtrip(report_to_json(pair)), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**_roundtrip(report_to_json(pair)), "loaders": "none"}, schema)
