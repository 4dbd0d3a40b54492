"""Helpers of ``bench_stallbench.py``: the demo's request, one analysis, and the figures it reports."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from stallbench.analysis import whatif
from stallbench.analysis.analyze import analyze, prepare
from stallbench.analysis.memory import sized_memory
from stallbench.analysis.phases import RunPlan
from stallbench.analysis.request import AnalysisRequest, CacheSpec
from stallbench.analysis.results import LoaderReport, Prediction
from stallbench.cli import make_parser
from stallbench.conditions.limits import probe_storage_conditions
from stallbench.demo import demo_request
from stallbench.report import plain_table

__all__ = [
    "Config",
    "analyze_one",
    "checked_demo_request",
    "compare_table",
    "figures",
    "measured_line",
    "plan_for",
    "predict",
    "prediction_table",
]

MB = 1e6
_STAGES = ("compute", "prep", "fetch")
_FIGURES = ("epoch_s", "compute_s", "prep_stall_s", "fetch_stall_s", "warmup_s", "storage_MB", "hit_rate")


@dataclass(frozen=True)
class Config:
    """One configuration of the cached loader on the demo workload."""

    cache: float  # fraction of the dataset
    workers: int

    def __str__(self) -> str:
        return f"cache{self.cache * 100:.0f}-w{self.workers}"


def checked_demo_request(root: Path) -> AnalysisRequest:
    """The demo's compare request on data under ``root``; fails with the probe's reasons where the
    storage throttle, memory limit or page cache eviction cannot be set up (the demo would go unlimited)."""
    data_dir = root / "demo"
    data_dir.mkdir(parents=True, exist_ok=True)
    problems = {k: v for k, v in probe_storage_conditions(data_dir).items() if v is not None}
    if problems:
        pytest.fail(f"the demo's storage conditions cannot be set up here: {problems}", pytrace=False)
    return demo_request(make_parser().parse_args(["demo", "--data-dir", str(data_dir)]))[0]


def plan_for(req: AnalysisRequest, config: Config) -> RunPlan:
    """The cached loader's plan at ``config``; memory "auto" is sized again for this cache and workers."""
    plan = prepare(replace(req, cache=CacheSpec(config.cache), workers=config.workers), ("cached",))
    return sized_memory(plan, ("cached",))


def analyze_one(plan: RunPlan, kind: str) -> LoaderReport:
    return next(analyze(plan, (kind,)))


def figures(r: LoaderReport) -> dict[str, float]:
    b = r.breakdown
    values = (b.epoch_seconds, b.compute_seconds, b.prep_stall_seconds, b.fetch_stall_seconds)
    values += (b.warmup_seconds, r.storage_bytes / MB, r.hit_rate)
    return dict(zip(_FIGURES, values, strict=True))


def compare_table(torch: LoaderReport, cached: LoaderReport) -> str:
    """Steady cold epoch, figure by figure: torch, ours and ours / torch."""
    t, c = figures(torch), figures(cached)
    rows = [[k, t[k], c[k], f"{c[k] / t[k]:.2f}" if t[k] else "-"] for k in _FIGURES]
    return plain_table(["figure", "torch", "cached", "cached/torch"], rows)


def predict(base: LoaderReport, config: Config) -> Prediction:
    """``whatif.predict`` from the measured ``base`` for ``config`` (cache sized as ``prepare`` does it: a
    share of the device bytes)."""
    m = whatif.Measured(
        workload=base.workload,
        breakdown=base.breakdown,
        machine=base.machine,
        loader=base.loader,
        storage_bytes=base.storage_bytes,
    )
    cache = round(config.cache * base.workload.dataset_bytes)
    return whatif.predict(m, cache_bytes=cache, workers=config.workers)


def measured_line(r: LoaderReport) -> str:
    """The machine figures and roofline terms a prediction starts from."""
    m, roof = r.machine, r.roofline
    rates = f"storage {m.storage_bytes_per_s / MB:.1f} MB/s, prep {m.prep_samples_per_s_per_core:.0f}/s"
    terms = ", ".join(f"{k} {getattr(roof, f'{k}_seconds'):.2f} s" for k in _STAGES)
    bound = f"{roof.bound}-bound, {roof.bound_ratio:.1%} of the epoch"
    return f"{rates} per core x {m.cores} cores; roofline {terms} ({bound})"


def prediction_table(rows: list[tuple[Config, Prediction, LoaderReport]]) -> str:
    headers = ["configuration", "bound", "predicted s", "measured s", "error %", "storage MB", "memory MB"]
    cells = []
    for config, p, r in rows:
        error = 100.0 * (p.epoch_seconds - r.breakdown.epoch_seconds) / r.breakdown.epoch_seconds
        memory = (r.workload.memory_limit or 0) / MB
        cells.append([str(config), p.bound, p.epoch_seconds, r.breakdown.epoch_seconds, f"{error:+.1f}"])
        cells[-1] += [r.storage_bytes / MB, memory]
    return plain_table(headers, cells)
