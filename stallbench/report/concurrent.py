"""What ``compare --jobs N`` prints and writes: a table per loader and per job, and its JSON
(``stallbench.concurrent/2``, documented in ``docs/stallbench-json.md`` and held by
:func:`validate_concurrent_json`). The first loader is the baseline of the ratios."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stallbench._files import write_atomic
from stallbench._grid import plain_table
from stallbench.analysis import results
from stallbench.analysis.concurrent import ConcurrentRun, JobRun
from stallbench.analysis.results import Workload
from stallbench.report import _clean, _ratio
from stallbench.report._schema import DRAFT, array, check, fields, free_map, kind, obj, or_null

__all__ = [
    "CONCURRENT_JSON_SCHEMA",
    "CONCURRENT_SCHEMA",
    "concurrent_to_json",
    "format_concurrent",
    "validate_concurrent_json",
    "write_concurrent_json",
]

CONCURRENT_SCHEMA = "stallbench.concurrent/2"
_WIDTH = 100  # columns of the terminal text
_NUM = kind("number|null")
_COORDINATION = obj(
    {
        "group": kind("string"),
        "status": kind("string"),
        **dict.fromkeys(("members", "batches_prepared", "batches_consumed"), kind("integer")),
        **dict.fromkeys(("prep_cpu_seconds", "prep_cpu_saved_seconds"), _NUM),
    }
)
_JOB = obj(
    {
        "job": kind("integer"),
        "epoch_seconds": array(_NUM),
        "cpu_seconds": array(_NUM),
        **dict.fromkeys(("samples", "batches"), kind("integer")),
        **dict.fromkeys(("start_time", "end_time"), kind("number")),
        "coordination": or_null(_COORDINATION),
    }
)
CONCURRENT_JSON_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT,
    "title": f"stallbench report ({CONCURRENT_SCHEMA}): compare --jobs --json",
    **obj(
        {
            "schema": {"const": CONCURRENT_SCHEMA},
            "workload": fields(results.Workload),
            "jobs_per_loader": kind("integer"),
            "loaders": array(
                obj(
                    {
                        "loader": kind("string"),
                        "samples": kind("integer"),
                        **dict.fromkeys(("wall_seconds", "samples_per_s"), _NUM),
                        "jobs": array(_JOB),
                    }
                )
            ),
            "ratios_to_baseline": free_map(obj({"samples_per_s": _NUM})),
        }
    ),
}


def _summary_rows(runs: Sequence[ConcurrentRun]) -> list[list[object]]:
    base = runs[0].samples_per_s
    return [
        [
            r.loader,
            len(r.jobs),
            r.samples,
            r.wall_seconds,
            r.samples_per_s,
            _times(_ratio(r.samples_per_s, base)),
        ]
        for r in runs
    ]


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _job_row(loader: str, j: JobRun) -> list[object]:
    """A job's row; the sharing columns are "-" for a job in no group (torch's)."""
    c = j.coordination
    shared = ["-"] * 4
    if c is not None:
        status = c["status"].split(":")[0]  # "alone: <why>" in full in the JSON
        shared = [c["batches_prepared"], c["batches_consumed"], c["prep_cpu_saved_seconds"], status]
    return [loader, j.job, j.mean_epoch_seconds, j.mean_cpu_seconds, *shared]


def format_concurrent(runs: Sequence[ConcurrentRun], workload: Workload) -> str:
    """The terminal text: the workload, aggregate samples/s per loader with its ratio, then each job."""
    _check_runs(runs)
    w, base = workload, runs[0].loader
    summary = plain_table(
        ["loader", "jobs", "samples", "wall s", "samples/s", f"vs {base}"], _summary_rows(runs)
    )
    jobs = plain_table(
        ["loader", "job", "s/epoch", "CPU s/epoch", "prepared", "consumed", "CPU saved s", "group"],
        [_job_row(r.loader, j) for r in runs for j in r.jobs],
    )
    head = (
        f"{len(runs[0].jobs)} jobs at once per loader, each {w.epochs} epoch(s) of {w.data} ({w.samples} "
        f"samples, batch {w.batch_size}, {w.workers} worker(s), compute {w.compute}), the data warm in the "
        "page cache"
    )
    notes = (
        "wall s: from the first job's first epoch to the end of the last job's last; samples/s: all the "
        "jobs' samples over it. s/epoch, CPU s/epoch: each job's mean over its epochs (CPU: user + system of "
        "the job's main process and workers). prepared, consumed: batches over all epochs; CPU saved s: the "
        "prep CPU other jobs of the group spent on the batches this one consumed."
    )
    return "\n\n".join([textwrap.fill(head, _WIDTH), summary, jobs, textwrap.fill(notes, _WIDTH)])


def _check_runs(runs: Sequence[ConcurrentRun]) -> None:
    if not runs:
        raise ValueError("runs must hold at least one ConcurrentRun, got none")
    names = [r.loader for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"loader names must differ, got {names!r}")


def concurrent_to_json(runs: Sequence[ConcurrentRun], workload: Workload) -> dict[str, Any]:
    """The documented JSON object; null where a number is not finite."""
    _check_runs(runs)
    loaders = [
        {
            "loader": r.loader,
            "samples": r.samples,
            "wall_seconds": r.wall_seconds,
            "samples_per_s": r.samples_per_s,
            "jobs": [dataclasses.asdict(j) for j in r.jobs],
        }
        for r in runs
    ]
    base = runs[0].samples_per_s
    return _clean(
        {
            "schema": CONCURRENT_SCHEMA,
            "workload": dataclasses.asdict(workload),
            "jobs_per_loader": len(runs[0].jobs),
            "loaders": loaders,
            "ratios_to_baseline": {
                r.loader: {"samples_per_s": _ratio(r.samples_per_s, base)} for r in runs[1:]
            },
        }
    )


def write_concurrent_json(runs: Sequence[ConcurrentRun], workload: Workload, path: str | os.PathLike) -> Path:
    """Write :func:`concurrent_to_json` to ``path`` atomically; returns the path."""
    text = json.dumps(concurrent_to_json(runs, workload), indent=1, allow_nan=False)
    return write_atomic(Path(path), (text + "\n").encode())


def validate_concurrent_json(report: Any) -> None:
    """Raise ValueError naming the first missing or mistyped key of a ``compare --jobs`` JSON object, checked
    against :data:`CONCURRENT_JSON_SCHEMA`."""
    check(report, CONCURRENT_JSON_SCHEMA)
