"""What ``analyze`` and ``compare`` print and write: the terminal table, the JSON, the PNG plot.

Each function takes a sequence of :class:`~stallbench.analysis.results.LoaderReport` on one workload, the
first being the baseline (PyTorch's DataLoader, ``"torch"``). The JSON schema is documented in
``docs/stallbench-json.md`` and held by :func:`validate_report_json`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stallbench._files import write_atomic
from stallbench.analysis import results
from stallbench.analysis.results import SCHEMA, LoaderReport, RunRecord
from stallbench.analysis.work import TimeToTarget, UsefulWork
from stallbench.report import plot, table
from stallbench.report.work import column_name

__all__ = ["format_report", "report_to_json", "validate_report_json", "write_json", "write_plot"]

_RATIO_KEYS = ("epoch_seconds", "fetch_stall_seconds", "storage_bytes")

_NUM = "number|null"  # every measured float: null where it was not finite
_KIND_OF_TYPE = {"int": "integer", "int | None": "integer|null", "str": "string", "str | None": "string|null"}
_KIND_OF_TYPE |= dict.fromkeys(("float", "float | None"), _NUM)


@dataclasses.dataclass(frozen=True)
class _Map:
    """An object whose keys are free (loader or stage names), each value of one kind."""

    values: Any


@dataclasses.dataclass(frozen=True)
class _OrNull:
    """An object, or null where nothing was measured."""

    spec: Any


def _fields(cls: type, but: str = "") -> dict[str, str]:
    """A results dataclass of plain fields (all ``but`` one) as a schema object: its JSON is ``asdict``."""
    return {f.name: _KIND_OF_TYPE[str(f.type)] for f in dataclasses.fields(cls) if f.name != but}


# The schema as data: a kind ("integer", "number", "string", "|null" allowed), an object (dict), a list of
# one kind ([kind]) or a _Map. Keys beyond these are allowed.
_LOADER: dict[str, Any] = {
    "loader": "string",
    **_fields(results.Breakdown),
    **dict.fromkeys(("prep_stall_percent", "fetch_stall_percent"), _NUM),
    **dict.fromkeys(("storage_bytes", "dataset_bytes", "record_bytes"), "integer"),
    **dict.fromkeys(("hit_rate", "cpu_utilisation", "samples_per_s"), _NUM),
    "machine": _fields(results.Machine),
    "roofline": _fields(results.Roofline),
    "predictions": [_fields(results.Prediction)],
    "advice": "string",
    "useful": _OrNull(
        {
            **_fields(UsefulWork, but="time_to_target"),
            "time_to_target": _OrNull({**_fields(TimeToTarget, but="reached"), "reached": "boolean"}),
        }
    ),
    "runs": [
        {
            "phase": "string",
            "condition": "string",
            "stage_seconds": _Map(_NUM),
            "epochs": [_fields(results.EpochRecord)],
            "other_load_cores": _NUM,
        }
    ],
}
_SCHEMA: dict[str, Any] = {
    "schema": "string",
    "workload": _fields(results.Workload),
    "loaders": [_LOADER],
    "ratios_to_baseline": _Map(dict.fromkeys(_RATIO_KEYS, _NUM)),
}
_KINDS = {
    "null": lambda v: v is None,
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "boolean": lambda v: isinstance(v, bool),
}


def _check_reports(reports: Sequence[LoaderReport]) -> None:
    if not reports:
        raise ValueError("reports must hold at least one LoaderReport, got none")
    names = [column_name(r) for r in reports]  # the loader, and "+<algorithm>" for packed batches
    if len(set(names)) != len(names):
        raise ValueError(f"loader names must differ, got {names!r}")
    for r in reports[1:]:
        if r.workload != reports[0].workload:
            raise ValueError(f"loader {column_name(r)!r} ran another workload than {names[0]!r}")


def format_report(reports: Sequence[LoaderReport]) -> str:
    """The terminal table: one column per loader, and for each loader after the first one against it."""
    _check_reports(reports)
    return table.table_text(reports)


def _clean(value: Any) -> Any:
    """Tuples to lists, non-finite floats to None: what ``json.dumps(allow_nan=False)`` accepts."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _run_json(run: RunRecord) -> dict[str, Any]:
    return {
        "phase": run.phase,
        "condition": run.condition,
        "stage_seconds": dict(run.stage_seconds),
        "epochs": [dataclasses.asdict(e) for e in run.epochs],
        "other_load_cores": run.other_load_cores,
    }


def _loader_json(r: LoaderReport) -> dict[str, Any]:
    b = r.breakdown
    return {
        "loader": column_name(r),
        **dataclasses.asdict(b),
        "prep_stall_percent": b.percent(b.prep_stall_seconds),
        "fetch_stall_percent": b.percent(b.fetch_stall_seconds),
        "storage_bytes": r.storage_bytes,
        "dataset_bytes": r.dataset_bytes,
        "record_bytes": r.record_bytes,
        "hit_rate": r.hit_rate,
        "cpu_utilisation": r.cpu_utilisation,
        "samples_per_s": r.samples_per_s,
        "machine": dataclasses.asdict(r.machine),
        "roofline": dataclasses.asdict(r.roofline),
        "predictions": [dataclasses.asdict(p) for p in r.predictions],
        "advice": r.advice,
        "useful": dataclasses.asdict(r.useful) if r.useful is not None else None,
        "runs": [_run_json(run) for run in r.runs],
        "ranks": [{"rank": rb.rank, **dataclasses.asdict(rb.breakdown)} for rb in r.ranks],
        "slowest_rank": r.slowest_rank,
        "other_loaders": [dataclasses.asdict(o) for o in r.other_loaders],
        "prefetch_predictions": [dataclasses.asdict(p) for p in r.prefetch_predictions],
        "nodes_predictions": [dataclasses.asdict(p) for p in r.nodes_predictions],
    }


def _ratio(ours: float, base: float) -> float | None:
    return ours / base if math.isfinite(ours) and math.isfinite(base) and base > 0 else None


def report_to_json(reports: Sequence[LoaderReport]) -> dict[str, Any]:
    """The documented JSON object (``docs/stallbench-json.md``); null where a number is not finite."""
    _check_reports(reports)
    loaders = [_loader_json(r) for r in reports]
    ratios = {
        ours["loader"]: {k: _ratio(ours[k], loaders[0][k]) for k in _RATIO_KEYS} for ours in loaders[1:]
    }
    return _clean(
        {
            "schema": SCHEMA,
            "workload": dataclasses.asdict(reports[0].workload),
            "loaders": loaders,
            "ratios_to_baseline": ratios,
        }
    )


def write_json(reports: Sequence[LoaderReport], path: str | os.PathLike[str]) -> Path:
    """Write :func:`report_to_json` to ``path`` atomically; returns the path."""
    text = json.dumps(report_to_json(reports), indent=1, allow_nan=False)
    return write_atomic(Path(path), (text + "\n").encode())


def write_plot(reports: Sequence[LoaderReport], path: str | os.PathLike[str]) -> Path:
    """Write the PNG (epoch breakdown per loader; wait per iteration of each cold run) atomically."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"plot path must end in .png, got {str(path)!r}")
    _check_reports(reports)
    return write_atomic(path, plot.png_bytes(reports))


def _check(value: Any, spec: Any, where: str) -> None:
    if isinstance(spec, _OrNull):
        if value is not None:
            _check(value, spec.spec, where)
        return
    if isinstance(spec, str):
        if not any(_KINDS[kind](value) for kind in spec.split("|")):
            raise ValueError(f"report JSON: {where} must be {spec}, got {type(value).__name__} {value!r:.40}")
        return
    expected = list if isinstance(spec, list) else dict
    if not isinstance(value, expected):
        raise ValueError(
            f"report JSON: {where or 'the report'} must be {expected.__name__}, got {value!r:.40}"
        )
    if isinstance(spec, list):
        for i, item in enumerate(value):
            _check(item, spec[0], f"{where}[{i}]")
    elif isinstance(spec, _Map):
        for key, item in value.items():
            _check(item, spec.values, f"{where}.{key}")
    else:
        for key, sub in spec.items():
            name = f"{where}.{key}" if where else key
            if key not in value:
                raise ValueError(f"report JSON: {name} is missing")
            _check(value[key], sub, name)


def validate_report_json(obj: Any) -> None:
    """Raise ValueError naming the first missing or mistyped key of a report JSON object (parsed)."""
    _check(obj, _SCHEMA, "")
    if obj["schema"] != SCHEMA:
        raise ValueError(f"report JSON: schema must be {SCHEMA!r}, got {obj['schema']!r}")
    if not obj["loaders"]:
        raise ValueError("report JSON: loaders must hold at least one loader, got none")
