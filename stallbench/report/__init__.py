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
from stallbench._grid import plain_table
from stallbench.analysis.knobs import KNOBS
from stallbench.analysis.results import SCHEMA, LoaderReport, RankBreakdown, RunRecord
from stallbench.report import plot, table
from stallbench.report._schema import check
from stallbench.report.report_schema import RATIO_KEYS, REPORT_SCHEMA
from stallbench.report.work import column_name

__all__ = [
    "REPORT_SCHEMA",
    "format_report",
    "plain_table",
    "report_to_json",
    "validate_report_json",
    "write_json",
    "write_plot",
]


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
        "advice": r.advice,
        "useful": dataclasses.asdict(r.useful) if r.useful is not None else None,
        "runs": [_run_json(run) for run in r.runs],
        "ranks": [_rank_json(rb) for rb in r.ranks],
        "slowest_rank": r.slowest_rank,
        "holding_rank": r.holding_rank,
        "slow_sample_count": r.slow_sample_count,
        "slow_samples": [dataclasses.asdict(s) for s in r.slow_samples],
        "slow_again": r.slow_again,
        "other_loaders": [dataclasses.asdict(o) for o in r.other_loaders],
        **{knob.name: [dataclasses.asdict(p) for p in getattr(r, knob.name)] for knob in KNOBS},
    }


def _rank_json(rb: RankBreakdown) -> dict[str, Any]:
    return {
        "rank": rb.rank,
        **dataclasses.asdict(rb.breakdown),
        "waits_for_others_seconds": rb.waits_for_others_seconds,
        "holds_others_seconds": rb.holds_others_seconds,
    }


def _ratio(ours: float, base: float) -> float | None:
    return ours / base if math.isfinite(ours) and math.isfinite(base) and base > 0 else None


def report_to_json(reports: Sequence[LoaderReport]) -> dict[str, Any]:
    """The documented JSON object (``docs/stallbench-json.md``); null where a number is not finite."""
    _check_reports(reports)
    loaders = [_loader_json(r) for r in reports]
    ratios = {ours["loader"]: {k: _ratio(ours[k], loaders[0][k]) for k in RATIO_KEYS} for ours in loaders[1:]}
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


def validate_report_json(report: Any) -> None:
    """Raise ValueError naming the first missing or mistyped key of a report JSON object (parsed), checked
    against :data:`REPORT_SCHEMA` (published as ``docs/stallbench-report.schema.json``)."""
    check(report, REPORT_SCHEMA)
    if not report["loaders"]:
        raise ValueError("report JSON: loaders must hold at least one loader, got none")
