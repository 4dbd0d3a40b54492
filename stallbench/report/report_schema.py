"""The report JSON's schema (``stallbench.report/<n>``), as ``validate_report_json`` checks it and as
``docs/stallbench-report.schema.json`` publishes it: built from the result types' own fields."""

from __future__ import annotations

from typing import Any

from stallbench.analysis import results
from stallbench.analysis.knobs import KNOBS
from stallbench.analysis.results import SCHEMA
from stallbench.analysis.work import TimeToTarget, UsefulWork
from stallbench.report._schema import DRAFT, array, fields, free_map, kind, obj, or_null

__all__ = ["RATIO_KEYS", "REPORT_SCHEMA"]

RATIO_KEYS = ("epoch_seconds", "fetch_stall_seconds", "storage_bytes")

_NUM = kind("number|null")  # every measured float: null where it was not finite
_LOADER = obj(
    {
        "loader": kind("string"),
        **fields(results.Breakdown)["properties"],
        **dict.fromkeys(("prep_stall_percent", "fetch_stall_percent"), _NUM),
        **dict.fromkeys(("storage_bytes", "dataset_bytes", "record_bytes"), kind("integer")),
        **dict.fromkeys(("hit_rate", "cpu_utilisation", "samples_per_s"), _NUM),
        "machine": fields(results.Machine),
        "roofline": fields(results.Roofline),
        **{knob.name: {**array(fields(knob.result)), "description": knob.varies} for knob in KNOBS},
        "advice": kind("string"),
        "useful": or_null(
            obj(
                {
                    **fields(UsefulWork, but=("time_to_target",))["properties"],
                    "time_to_target": or_null(fields(TimeToTarget)),
                }
            )
        ),
        "ranks": array(
            obj(
                {
                    "rank": kind("integer"),
                    **fields(results.Breakdown)["properties"],
                    **dict.fromkeys(("waits_for_others_seconds", "holds_others_seconds"), _NUM),
                }
            )
        ),
        **dict.fromkeys(("slowest_rank", "holding_rank"), kind("integer|null")),
        "slow_sample_count": kind("integer"),
        "slow_samples": array(fields(results.SlowSample)),
        "slow_again": kind("number|null"),
        "runs": array(
            obj(
                {
                    "phase": kind("string"),
                    "condition": kind("string"),
                    "stage_seconds": free_map(_NUM),
                    "epochs": array(fields(results.EpochRecord)),
                    "other_load_cores": _NUM,
                }
            )
        ),
    }
)
REPORT_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT,
    "title": f"stallbench report ({SCHEMA}): analyze and compare --json",
    **obj(
        {
            "schema": {"const": SCHEMA},
            "workload": fields(results.Workload),
            "loaders": array(_LOADER),
            "ratios_to_baseline": free_map(obj(dict.fromkeys(RATIO_KEYS, _NUM))),
        }
    ),
}
