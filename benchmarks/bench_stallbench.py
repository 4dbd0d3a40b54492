"""stallbench on its own demo workload: the verdict of ``compare`` and the accuracy of its predictions.

The demo workload: 6,000 generated JPEGs of ~112 KB, storage reads throttled by the kernel to
75 MB/s, memory "auto" (the cache budget plus the job's measured memory, the same rule for every run),
compute emulated at 10 ms a batch, batch 64, 3 epochs. Figures are steady cold epochs (epochs 2-3); bytes
are device bytes (whole pages, the kernel's count), cache fractions are of the dataset's device bytes.

* compare: torch's DataLoader and ours at a cache of half the dataset, 2 workers; ours must cut the steady
  fetch stall to at most half of torch's.
* predict: ours analysed at cache 50%, 2 workers; ``whatif.predict`` from that point for caches of 25% and
  75% (2 workers) and 1 and 4 workers (cache 50%), each then measured: every prediction within 15%.

    python -m pytest benchmarks/bench_stallbench.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _stallbench_cases import (
    Config,
    analyze_one,
    checked_demo_request,
    compare_table,
    figures,
    measured_line,
    plan_for,
    predict,
    prediction_table,
)

from stallbench.analysis.analyze import prepare
from stallbench.analysis.memory import sized_memory
from stallbench.analysis.phases import RunPlan
from stallbench.analysis.request import AnalysisRequest
from stallbench.analysis.results import LoaderReport
from stallbench.jobs.kinds import DEFAULT as KINDS

MAX_FETCH_RATIO = 0.5  # ours' steady fetch stall / torch's
BASE = Config(cache=0.5, workers=2)
OTHERS = (Config(0.25, 2), Config(0.75, 2), Config(0.5, 1), Config(0.5, 4))
MAX_ERROR = 0.15  # |predicted - measured| / measured steady epoch


@pytest.fixture(scope="module")
def demo(bench_data_root: Path) -> AnalysisRequest:
    return checked_demo_request(bench_data_root)


@pytest.fixture(scope="module")
def compare_plan(demo: AnalysisRequest) -> RunPlan:
    """The demo's "auto" memory sized once, over both kinds: one limit for both, probed outside the timing."""
    return sized_memory(prepare(demo, KINDS), KINDS)


@pytest.fixture(scope="module")
def reports() -> dict[str, LoaderReport]:
    return {}


def _record(benchmark, report: LoaderReport) -> None:
    w = report.workload
    info = benchmark.extra_info
    info.update(figures(report), cache_bytes=w.cache_bytes, memory_limit=w.memory_limit)
    info.update(dataset_bytes=w.dataset_bytes, record_bytes=w.record_bytes, workers=w.workers)
    info.update(storage_bandwidth=w.storage_bandwidth)
    info.update(measured_storage_bps=report.machine.storage_bytes_per_s)
    info.update(roofline_bound_ratio=report.roofline.bound_ratio)
    info.update(prep_per_core_per_s=report.machine.prep_samples_per_s_per_core)
    info.update({f"{run.phase}_epoch_s": [e.seconds for e in run.epochs] for run in report.runs})


@pytest.mark.benchmark(group="stallbench-compare")
@pytest.mark.parametrize("kind", KINDS)
def test_compare(benchmark, compare_plan: RunPlan, reports: dict[str, LoaderReport], kind: str) -> None:
    reports[kind] = benchmark.pedantic(analyze_one, args=(compare_plan, kind), rounds=1, iterations=1)
    _record(benchmark, reports[kind])


def test_compare_target(reports: dict[str, LoaderReport]) -> None:
    if not set(KINDS) <= set(reports):
        pytest.fail(f"only {sorted(reports)} ran; see the failures above", pytrace=False)
    torch, cached = reports["torch"], reports["cached"]
    w = cached.workload
    device, records = w.dataset_bytes / 1e6, w.record_bytes / 1e6
    print(f"\ncompare on the demo: D = {device:.1f} MB on the device ({records:.1f} MB of records),")
    print(f"cache {w.cache_bytes / 1e6:.1f} MB,")
    print(f"{', '.join(w.limits.said())}, for both")
    print(compare_table(torch, cached))
    limit = MAX_FETCH_RATIO * torch.breakdown.fetch_stall_seconds
    fetch = cached.breakdown.fetch_stall_seconds
    assert fetch <= limit, f"ours' fetch stall {fetch:.2f} s > {MAX_FETCH_RATIO} x torch's ({limit:.2f} s)"


@pytest.mark.benchmark(group="stallbench-predict")
@pytest.mark.parametrize("config", (BASE, *OTHERS), ids=str)
def test_predict(benchmark, demo: AnalysisRequest, reports: dict[str, LoaderReport], config: Config) -> None:
    plan = plan_for(demo, config)
    report = benchmark.pedantic(analyze_one, args=(plan, "cached"), rounds=1, iterations=1)
    reports[str(config)] = report
    _record(benchmark, report)
    if config != BASE and str(BASE) in reports:
        benchmark.extra_info["predicted_s"] = predict(reports[str(BASE)], config).epoch_seconds


def test_predict_target(reports: dict[str, LoaderReport]) -> None:
    missing = [str(c) for c in (BASE, *OTHERS) if str(c) not in reports]
    if missing:
        pytest.fail(f"{missing} did not run; see the failures above", pytrace=False)
    base = reports[str(BASE)]
    rows = [(c, predict(base, c), reports[str(c)]) for c in (BASE, *OTHERS)]
    print(f"\npredictions from {BASE} (the measured point), each configuration then measured")
    print(f"at {BASE}: {measured_line(base)}")
    print(prediction_table(rows))
    errors = {str(c): abs(p.epoch_seconds / r.breakdown.epoch_seconds - 1) for c, p, r in rows}
    missed = {k: f"{v:.1%}" for k, v in errors.items() if v > MAX_ERROR}
    assert not missed, f"predictions off by more than {MAX_ERROR:.0%}: {missed}"
