"""``stallbench analyze -- COMMAND``: what its bootstrap costs a job, and how near ``--apply`` lands.

* overhead: a job with no stall (in-memory samples, a fixed CPU step, 200 steps x 4 epochs) run plainly and
  under the bootstrap (every DataLoader iteration timed), alternating, 5 pairs: steps/s under the bootstrap
  >= 0.98 of plain (median of the pairs);
* agreement: the example script analyzed through the bootstrap, and the same workload as a generated job
  (``_example_job.py``: the example's own transform and CNN step, the same data, batch, workers and steps),
  18,000 JPEGs of 500x375 (~112 KB, as the demo's; an epoch of 12 batches reads 4% of them, so each reads
  mostly from storage), storage throttled to 20 MB/s, 3 rounds of the two alternating: compute, prep stall
  and fetch stall (medians of the rounds) each within 5 points of the epoch of each other. Both are split by
  the one method (``stallbench.analysis.breakdown``: the cold run's own wait and step), so what is left
  between them is the two jobs' difference and the noise of a round;
* each what-if: the example analyzed with our loader on two jobs, prep waiting off the CPU (a 3 ms sleep per
  sample, storage throttled to 2 MB/s) and a step on the CPU sharing the 2 cores with decode (96 px images
  of 500x375 JPEGs); the predictions for 1 and 4 workers, a quarter and all of the dataset as cache and
  ``prefetch_factor`` 1 and 4, each against a cold run of the example with that setting: within 15%;
* ``--apply``: the example script (``examples/train_cnn.py``, 1 worker, prep-bound by a 3 ms sleep per
  sample) analyzed, then the advised worker count rerun cold: |measured / predicted - 1| <= 0.15;
* ``--apply`` of a cache: the example with torch's loader on 18,000 JPEGs of 112 KB (2 GB), storage at
  50 MB/s, ``--memory-limit auto`` (the 50% budget plus the job's measured memory): the advice names our
  loader with ``cache_bytes`` and ``cache_files``, rerun cold under the same limit: within 15%;
* ``--apply`` of a form: a loop over 1,200 JPEGs of 500x375 through our loader with ``cache_form="raw"``
  forced (``tests/_user_scripts/train_ours.py``, no step: decode binds), analyzed; the advised
  ``cache_form='prepared'`` rerun cold, 3 rounds: the median |measured / predicted - 1| <= 0.15.

    python -m pytest benchmarks/bench_user_job.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import io
import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest

from stallbench.analysis.analyze import analyze, prepare
from stallbench.analysis.request import AnalysisRequest
from stallbench.conditions.limits import Limits
from stallbench.jobs.command import run_command
from stallbench.jobs.spec import JobSpec
from stallbench.workloads import make_jpeg_folder

REPO = Path(__file__).resolve().parents[1]
NO_STALL = Path(__file__).with_name("_no_stall_script.py")
EXAMPLE = REPO / "examples" / "train_cnn.py"
PAIRS = 5
MAX_OVERHEAD = 0.02  # steps/s lost to the bootstrap
MAX_APPLY_ERROR = 0.15
MAX_DISAGREEMENT = 5.0  # percentage points of the epoch, per term
EXAMPLE_JOB = Path(__file__).with_name("_example_job.py")
STEPS, BANDWIDTH, ROUNDS = 12, 20_000_000, 3


def _small_images(root: Path) -> Path:
    """600 JPEGs of 6,000 B: the example is prep-bound on them with a 3 ms sleep per sample."""
    return make_jpeg_folder(
        root / "jpeg-600x6000-64x48", num_images=600, record_bytes=6000, width=64, height=48
    )


def _analyze_example(data: Path, tmp_path: Path, options: list[str], workers: int) -> list[str]:
    """``stallbench analyze`` (3 epochs, output to a log) of the example, prep-bound by a 3 ms sleep."""
    argv = [
        sys.executable,
        "-m",
        "stallbench",
        "analyze",
        "--data",
        str(data),
        "--epochs",
        "3",
        "--no-progress",
    ]
    argv += ["--quiet", "--log", str(tmp_path / "log.txt"), *options, "--", sys.executable, str(EXAMPLE)]
    return [*argv, "--data", str(data), "--epochs", "5", "--workers", str(workers), "--slow-ms", "3"]


def _steps_per_s(text: str) -> float:
    return float(re.search(r"steps_per_s ([\d.]+)", text)[1])


def _plain() -> float:
    done = subprocess.run([sys.executable, str(NO_STALL)], text=True, capture_output=True, check=True)
    return _steps_per_s(done.stdout)


def _measured() -> float:
    log = io.StringIO()
    run = run_command([sys.executable, str(NO_STALL)], JobSpec(out_dir=""), log=log)
    assert run.records, "the bootstrap timed no epoch"
    return _steps_per_s(log.getvalue())


@pytest.mark.benchmark(group="user-job")
def test_bootstrap_overhead(benchmark) -> None:
    pairs = benchmark.pedantic(
        lambda: [(_plain(), _measured()) for _ in range(PAIRS)], rounds=1, iterations=1
    )
    ratios = [measured / plain for plain, measured in pairs]
    benchmark.extra_info.update(pairs=pairs, ratios=ratios)
    print(f"\nsteps/s under the bootstrap / plain, {PAIRS} pairs: {[f'{r:.3f}' for r in ratios]}")
    assert statistics.median(ratios) >= 1 - MAX_OVERHEAD, ratios


class Applied(NamedTuple):
    """What ``analyze --apply`` printed: its advice, its ``--apply`` line and that line's two epochs."""

    advice: str
    line: str
    predicted: float
    measured: float


def _applied(argv: list[str], timeout: float) -> Applied:
    done = subprocess.run(
        argv, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, capture_output=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (advice,) = [line for line in done.stdout.splitlines() if line.startswith("advice")]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("--apply")]
    match = re.search(r"predicted ([\d.]+) s, measured ([\d.]+) s", line)
    assert match, line
    return Applied(advice, line, float(match[1]), float(match[2]))


@pytest.mark.benchmark(group="user-job")
def test_apply_predicts_the_advised_setting(benchmark, bench_data_root: Path, tmp_path: Path) -> None:
    data = _small_images(bench_data_root)
    argv = _analyze_example(data, tmp_path, ["--apply"], workers=1)
    applied = benchmark.pedantic(lambda: _applied(argv, timeout=600), rounds=1, iterations=1)
    print(f"\n{applied.advice}\n{applied.line}")
    benchmark.extra_info.update(predicted=applied.predicted, measured=applied.measured)
    assert abs(applied.measured / applied.predicted - 1) <= MAX_APPLY_ERROR, applied.line


FORM_SCRIPT = REPO / "tests" / "_user_scripts" / "train_ours.py"
FORM_ROUNDS = 3


def _applied_form(data: Path, tmp_path: Path) -> tuple[float, float]:
    """``analyze --apply`` of a script that forces raw records on a prep-bound loop: (predicted, measured)
    steady epoch of the form advised."""
    argv = [sys.executable, "-m", "stallbench", "analyze", "--data", str(data), "--epochs", "3"]
    argv += ["--no-progress", "--quiet", "--log", str(tmp_path / "form-log.txt"), "--apply", "--"]
    argv += [sys.executable, str(FORM_SCRIPT), "--data", str(data), "--epochs", "5"]
    applied = _applied(argv, timeout=1200)
    assert "cache_form='prepared'" in applied.line, applied.line
    return applied.predicted, applied.measured


@pytest.mark.benchmark(group="user-job")
def test_apply_predicts_the_advised_form(benchmark, bench_data_root: Path, tmp_path: Path) -> None:
    data = make_jpeg_folder(bench_data_root / "prep-1200", num_images=1200)
    rounds = benchmark.pedantic(
        lambda: [_applied_form(data, tmp_path) for _ in range(FORM_ROUNDS)], rounds=1, iterations=1
    )
    errors = [measured / predicted - 1 for predicted, measured in rounds]
    benchmark.extra_info.update(rounds=rounds, errors=errors)
    print(f"\ncache_form='prepared' advised, (predicted, measured) s: {rounds}; errors {errors}")
    assert abs(statistics.median(errors)) <= MAX_APPLY_ERROR, rounds


CACHE_ADVICE_BPS = "50MB"


@pytest.mark.benchmark(group="user-job")
@pytest.mark.timeout(2400)  # 2 GB at 50 MB/s: four runs with a cold first epoch each, and the data made once
def test_apply_runs_the_cache_advice_under_a_memory_limit(
    benchmark, bench_data_root: Path, tmp_path: Path
) -> None:
    """The example with torch's loader on data twice its memory: the advice names our loader with a cache
    and ``cache_files=``, and ``--apply`` runs the example with it under the same limit."""
    data = make_jpeg_folder(bench_data_root / "jpeg-18000x114688", num_images=18_000, record_bytes=112 << 10)
    argv = [sys.executable, "-m", "stallbench", "analyze", "--data", str(data), "--epochs", "3"]
    argv += ["--memory-limit", "auto", "--storage-bandwidth", CACHE_ADVICE_BPS, "--no-progress", "--quiet"]
    argv += ["--log", str(tmp_path / "cache-log.txt"), "--apply", "--", sys.executable, str(EXAMPLE)]
    argv += ["--data", str(data), "--epochs", "5", "--eval-fraction", "0.001"]
    applied = benchmark.pedantic(lambda: _applied(argv, timeout=1800), rounds=1, iterations=1)
    print(f"\n{applied.advice}\n{applied.line}")
    assert "cache_files=" in applied.line, applied.line
    benchmark.extra_info.update(predicted=applied.predicted, measured=applied.measured)
    assert abs(applied.measured / applied.predicted - 1) <= MAX_APPLY_ERROR, applied.line


def _split(loader: dict) -> dict[str, float]:
    epoch = loader["epoch_seconds"]
    return {k: 100 * loader[f"{k}_seconds"] / epoch for k in ("compute", "prep_stall", "fetch_stall")}


def _example_split(data: Path, tmp_path: Path) -> dict[str, float]:
    out = tmp_path / "example.json"
    argv = [sys.executable, "-m", "stallbench", "analyze", "--data", str(data), "--steps", str(STEPS)]
    argv += ["--epochs", "3", "--storage-bandwidth", f"{BANDWIDTH}", "--no-progress", "--quiet"]
    argv += ["--log", str(tmp_path / "log.txt"), "--json", str(out), "--", sys.executable, str(EXAMPLE)]
    argv += ["--data", str(data), "--epochs", "5", "--eval-fraction", "0.001"]  # trains on all but 18
    done = subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return _split(json.loads(out.read_text())["loaders"][0])


def _generated_split(data: Path) -> dict[str, float]:
    request = AnalysisRequest(
        data=str(data),
        limits=Limits(storage_bandwidth=BANDWIDTH),
        epochs=3,
        transform="none",
        compute="emulated:0",
    )
    plan = replace(prepare(request, ["torch"]), job_script=str(EXAMPLE_JOB), max_batches=STEPS)
    (report,) = analyze(plan, ["torch"])
    b = report.breakdown
    return {
        "compute": b.percent(b.compute_seconds),
        "prep_stall": b.percent(b.prep_stall_seconds),
        "fetch_stall": b.percent(b.fetch_stall_seconds),
    }


@pytest.mark.benchmark(group="user-job")
def test_the_example_agrees_with_the_same_generated_job(
    benchmark, bench_data_root: Path, tmp_path: Path
) -> None:
    data = make_jpeg_folder(bench_data_root / "jpeg-18000x114688", num_images=18_000, record_bytes=112 << 10)
    rounds = benchmark.pedantic(
        lambda: [(_example_split(data, tmp_path), _generated_split(data)) for _ in range(ROUNDS)],
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update(rounds=rounds)
    print("\n% of the epoch (compute / prep stall / fetch stall), example (bootstrap) vs generated:")
    for example, generated in rounds:
        print(f"  {_terms(example)}  vs  {_terms(generated)}")
    for term in rounds[0][0]:
        example, generated = (statistics.median(r[side][term] for r in rounds) for side in (0, 1))
        print(f"  {term} medians: {example:.1f} vs {generated:.1f}")
        assert abs(example - generated) <= MAX_DISAGREEMENT, (term, rounds)


def _terms(split: dict[str, float]) -> str:
    return " / ".join(f"{value:4.1f}" for value in split.values())


WHAT_IF_JOBS = {
    # prep-bound off the CPU: a 3 ms sleep per sample (a remote read), small JPEGs; storage throttled so
    # that the cache matters too
    "sleeping prep": (["--slow-ms", "3"], "jpeg-600x6000-64x48", ["--storage-bandwidth", "2MB"]),
    # a step on the CPU that holds a core beside decode of 500x375 JPEGs: the 2 cores shared
    "CPU-bound step": (["--image-size", "96"], "jpeg-600x112k", []),
}


def _what_if_data(root: Path, name: str) -> Path:
    if name == "jpeg-600x6000-64x48":
        return _small_images(root)
    return make_jpeg_folder(root / name, num_images=600, record_bytes=112 << 10)


def _what_if_checks(report: dict, w: dict) -> list[tuple[str, dict, float]]:
    """(what, the setting, its predicted epoch) of a loader's ``report`` on workload ``w``: workers 1 and 4, a
    quarter and all of the dataset as cache, prefetch_factor 1 and 4, each with the rest as run."""
    at = {(p["cache_bytes"], p["workers"]): p["epoch_seconds"] for p in report["predictions"]}
    prefetch = {p["prefetch_factor"]: p["epoch_seconds"] for p in report["prefetch_predictions"]}
    checks = [(f"{n} workers", {"workers": n}, at[w["cache_bytes"], n]) for n in (1, 4)]
    for share in (0.25, 1.0):
        cache = round(share * w["dataset_bytes"])
        checks.append((f"cache {share:.0%}", {"cache_bytes": cache}, at[cache, w["workers"]]))
    checks += [(f"prefetch {f}", {"prefetch_factor": f}, prefetch[f]) for f in (1, 4)]
    return checks


@pytest.mark.benchmark(group="user-job")
@pytest.mark.parametrize("job", list(WHAT_IF_JOBS))
def test_each_what_if_holds(benchmark, bench_data_root: Path, tmp_path: Path, job: str) -> None:
    from stallbench.analysis.apply import run_setting
    from stallbench.analysis.user_analysis import UserJob

    script_options, folder, options = WHAT_IF_JOBS[job]
    data = _what_if_data(bench_data_root, folder)
    out = tmp_path / "report.json"
    argv = [sys.executable, "-m", "stallbench", "analyze", "--loader", "cached", "--data", str(data)]
    argv += ["--epochs", "4", "--no-progress", "--quiet", "--log", str(tmp_path / "log.txt"), *options]
    command = [sys.executable, str(EXAMPLE), "--data", str(data), "--epochs", "6", "--eval-fraction", "0.01"]
    argv += ["--json", str(out), "--", *command, *script_options]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def measure() -> list[tuple[str, float, float]]:
        done = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        whole = json.loads(out.read_text())
        report, w = whole["loaders"][0], whole["workload"]
        user_job = UserJob(
            argv=(*command, *script_options), data=(data,), dataset_bytes=w["dataset_bytes"],
            record_bytes=w["record_bytes"], cache_bytes=w["cache_bytes"],
            limits=Limits(w["storage_bandwidth"], w["memory_limit"]), epochs=4,
        )  # fmt: skip
        print(f"\n{job}: {report['advice']}")
        results = []
        for what, setting, predicted in _what_if_checks(report, w):
            setting = {"cache_bytes": w["cache_bytes"], **setting}
            results.append((what, predicted, run_setting(user_job, "cached", log=io.StringIO(), **setting)))
        return results

    results = benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(results=results)
    for what, predicted, measured in results:
        error = measured / predicted - 1
        print(f"  {what}: predicted {predicted:.3f} s, measured {measured:.3f} s ({error:+.0%})")
    misses = [r for r in results if abs(r[2] / r[1] - 1) > MAX_APPLY_ERROR]
    assert not misses, misses
