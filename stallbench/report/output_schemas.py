"""The schemas of stallbench's other JSON outputs, published beside the report's in ``docs/``: the timing of
your own loop (``stallbench.profile(...).save()``, ``stallbench.profile/<n>``) and the cache simulation
(``stallbench simulate --json``, ``stallbench.simulate/<n>``)."""

from __future__ import annotations

from typing import Any

from stallbench.profile import PROFILE_SCHEMA_VERSION
from stallbench.report._schema import DRAFT, array, fields, free_map, kind, obj
from stallbench.simulate import SIMULATE_SCHEMA_VERSION, EpochResult, SimulationResult

__all__ = ["PROFILE_SCHEMA", "SIMULATE_SCHEMA"]

_NUM = kind("number|null")  # a figure not measured (no batch, no step) is null
_SECONDS = array(kind("number"))

PROFILE_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "stallbench.profile",
    **obj(
        {
            "schema": {"const": f"stallbench.profile/{PROFILE_SCHEMA_VERSION}"},
            "name": kind("string"),
            "epochs": array(
                obj(
                    {
                        "index": kind("integer"),
                        "iterations": kind("integer"),
                        "complete": kind("boolean"),
                        **dict.fromkeys(("seconds", "wait_s", "step_s"), kind("number")),
                        **dict.fromkeys(("first_batch_s", "end_wait_s"), _NUM),
                    }
                )
            ),
            "steady": obj(
                {
                    "iterations": kind("integer"),
                    **dict.fromkeys(("wait_s", "step_s"), kind("number")),
                    **dict.fromkeys(("wait_fraction", "iterations_per_s"), _NUM),
                    **{
                        f"{part}_{stat}_s": _NUM
                        for part in ("wait", "step")
                        for stat in ("mean", "p50", "p95")
                    },
                }
            ),
            "transitions": obj(
                {
                    "first_batch_s": _SECONDS,
                    "epoch_gap_s": _SECONDS,
                    "epoch_end_wait_s": _SECONDS,
                    "phases": free_map(_SECONDS),
                }
            ),
            "loader_stats": {"type": ["object", "null"]},  # the loader's own stats(), as it gives them
        }
    ),
}

SIMULATE_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "stallbench.simulate",
    **obj(
        {
            "schema": {"const": f"stallbench.simulate/{SIMULATE_SCHEMA_VERSION}"},
            "simulations": array(
                obj(
                    {
                        **fields(SimulationResult, but=("epochs",))["properties"],
                        "epochs": array(fields(EpochResult)),
                        "floor_storage_bytes": kind("integer"),
                    }
                )
            ),
        }
    ),
}
