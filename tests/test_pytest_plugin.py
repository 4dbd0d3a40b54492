"""The pytest plugin: ``loader_stalls`` passes a fast pipeline, fails a slow one, fills pytest-benchmark.

Most tests run an inner pytest session with ``pytester``, as a user's suite would see the plugin: loaded
from the installed ``pytest11`` entry point, not imported by the test.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import loader
from stallbench.pytest_plugin import LoaderStalls, _batch_samples, measure_stalls
from stallbench.workloads import make_jpeg_folder

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.serial  # runs pytest inside, which pytest-benchmark turns off under xdist

# Loaders for the inner sessions: a fast one, whose waits are tiny next to a 5 ms step, and one whose
# dataset sleeps 3 ms per sample with nothing to do per step, so it waits nearly all of the time.
LOADERS = """
import time
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Sleepy(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.zeros(3)


def fast():
    return DataLoader(TensorDataset(torch.zeros(256, 3)), batch_size=8)


def slow():
    return DataLoader(Sleepy(), batch_size=2)


def step(batch):
    time.sleep(0.005)
"""


@pytest.fixture
def suite(pytester: pytest.Pytester):
    """Write ``LOADERS`` plus the given tests as the inner session's test module."""

    def write(tests: str) -> pytest.Pytester:
        pytester.makepyfile(test_user=LOADERS + tests)
        return pytester

    return write


def test_fast_loader_passes_and_slow_loader_fails_naming_fraction_and_threshold(suite) -> None:
    run = suite("""
def test_fast(loader_stalls):
    result = loader_stalls(fast(), step=step, steps=12, max_wait_fraction=0.5)
    assert result.steps == 12 and result.wait_fraction < 0.5 and result.samples_per_s > 0


def test_slow(loader_stalls):
    loader_stalls(slow(), steps=8, max_wait_fraction=0.2)
""").runpytest("-p", "no:cacheprovider")
    run.assert_outcomes(passed=1, failed=1)
    run.stdout.fnmatch_lines(
        [
            "*loader stalls: training waited for data *% of the time (wait_fraction *), "
            "above the threshold max_wait_fraction 0.2",
            "*waited * s, stepped * s over 7 steady-state batches (8 in 1 epoch(s)), plus * s waiting at*",
        ]
    )
    assert "test_fast" not in "".join(line for line in run.outlines if "FAILED" in line)


def test_benchmark_extra_info_gets_the_figures_and_the_table_one_round(suite, tmp_path: Path) -> None:
    run = suite("""
def test_pipeline(benchmark, loader_stalls):
    result = loader_stalls(fast(), step=step, steps=6)
    assert benchmark.extra_info["stallbench"] == result.to_dict()
""").runpytest("-p", "no:cacheprovider", f"--benchmark-json={tmp_path / 'bench.json'}")
    run.assert_outcomes(passed=1)
    (bench,) = json.loads((tmp_path / "bench.json").read_text())["benchmarks"]
    figures = bench["extra_info"]["stallbench"]
    assert figures["steps"] == 6 and 0 <= figures["wait_fraction"] < 1
    assert figures["prep_stall_seconds"] is None  # a torch DataLoader has no stage timings
    assert bench["stats"]["rounds"] == 1


def test_benchmark_already_used_or_disabled_still_measures(suite) -> None:
    run = suite("""
def test_used_first(benchmark, loader_stalls):
    benchmark(sum, [1, 2])
    loader_stalls(fast(), steps=3)
    loader_stalls(fast(), steps=4)  # pytest-benchmark allows one use: this one measures directly
    assert benchmark.extra_info["stallbench[2]"]["steps"] == 4


def test_twice(benchmark, loader_stalls):
    loader_stalls(fast(), steps=3)
    loader_stalls(fast(), steps=5)
    loader_stalls(slow(), steps=2, name="slow")
    info = benchmark.extra_info  # each call's figures apart: none mixes another's
    steps = [info[key]["steps"] for key in ("stallbench", "stallbench[2]", "stallbench[slow]")]
    assert steps == [3, 5, 2]
    with pytest.raises(ValueError, match="'stallbench\\[slow\\]' was measured already"):
        loader_stalls(slow(), steps=2, name="slow")


def test_without_benchmark(loader_stalls):
    assert loader_stalls(fast(), steps=2).steps == 2
""")
    run.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)
    run.runpytest("-p", "no:cacheprovider", "--benchmark-disable").assert_outcomes(passed=3)


def test_command_line_option_sets_the_threshold_a_call_can_override(suite) -> None:
    run = suite("""
def test_default(loader_stalls):
    loader_stalls(slow(), steps=6)


def test_own_threshold(loader_stalls):
    loader_stalls(slow(), steps=6, max_wait_fraction=1.0)
""")
    run.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)
    limited = run.runpytest("-p", "no:cacheprovider", "--stallbench-max-wait-fraction=0.3")
    limited.assert_outcomes(passed=1, failed=1)
    limited.stdout.fnmatch_lines(["*above the threshold --stallbench-max-wait-fraction 0.3"])


@pytest.mark.parametrize("value", ["0", "1.5", "-0.1", "nan", "lots"])
def test_bad_option_value_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    run = pytester.runpytest("-p", "no:cacheprovider", f"--stallbench-max-wait-fraction={value}")
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    run.stderr.fnmatch_lines([f"*--stallbench-max-wait-fraction*must be a number in (0, 1], got {value!r}*"])


@pytest.mark.parametrize("steps", [0, -3, 2.5, True, "10"])
def test_bad_steps_named(loader_stalls, steps) -> None:
    with pytest.raises(ValueError, match=r"steps must be a positive int, got"):
        loader_stalls([1, 2], steps=steps)


@pytest.mark.parametrize("fraction", [0, 1.5, -0.2, math.nan, True, "0.2"])
def test_bad_fraction_named(loader_stalls, fraction) -> None:
    with pytest.raises(ValueError, match=r"max_wait_fraction must be a number in \(0, 1\], got"):
        loader_stalls([1, 2], steps=2, max_wait_fraction=fraction)


def test_bad_step_and_empty_loader_named() -> None:
    with pytest.raises(TypeError, match="step must be a callable"):
        measure_stalls([1], step=3)
    with pytest.raises(TypeError, match="iterable loader"):
        measure_stalls(42)
    with pytest.raises(ValueError, match="loader gave no batch in epoch 1"):
        measure_stalls([], steps=3)


def test_short_loader_runs_more_epochs_and_keeps_epoch_starts_apart() -> None:
    batches = [torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(2, 2)]
    result = measure_stalls(batches, steps=7)
    assert (result.steps, result.epochs) == (7, 3)
    tl = result.profile.timeline()
    assert list(tl.index) == [0, 1, 2, 0, 1, 2, 0]
    assert result.wait_seconds == pytest.approx(float(tl.wait_s[tl.index > 0].sum()))
    assert result.first_batch_seconds == pytest.approx(float(tl.wait_s[tl.index == 0].sum()))
    assert result.samples_per_s == pytest.approx(12 / (result.wait_seconds + result.step_seconds))


def test_single_batch_still_gives_a_fraction() -> None:
    result = measure_stalls([torch.zeros(3)], steps=1)
    assert isinstance(result, LoaderStalls) and 0 <= result.wait_fraction <= 1


def test_cached_loader_splits_the_wait_into_prep_and_fetch(tmp_path: Path) -> None:
    root = make_jpeg_folder(tmp_path / "img", num_images=24, num_classes=2, width=32, height=24)
    data = loader.DataLoader(loader.ImageFolder(str(root), transform=loader.TrainTransform(size=16)), 4)
    result = measure_stalls(data, steps=5)
    assert result.prep_stall_seconds > 0 and result.fetch_stall_seconds > 0
    assert result.prep_stall_seconds + result.fetch_stall_seconds == pytest.approx(result.wait_seconds)
    plain = loader.DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2)  # no stage timings
    assert measure_stalls(plain, steps=2).prep_stall_seconds is None


def test_batch_sizes_of_common_batch_shapes() -> None:
    x, y = torch.zeros(5, 3), torch.zeros(5)
    assert _batch_samples((x, y)) == 5
    assert _batch_samples({"image": x, "label": y}) == 5
    assert _batch_samples([{"a": x}]) == 5
    assert _batch_samples([3, 1, 4]) == 3
    assert _batch_samples(["a", "b"]) == 2
    assert _batch_samples(torch.tensor(1.0)) is None
    assert _batch_samples(object()) is None
    assert measure_stalls(DataLoader(TensorDataset(x, y), batch_size=2), steps=3).samples_per_s > 0


def test_the_how_to_runs_as_written(pytester: pytest.Pytester, tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "how-to" / "fail-ci-on-stalls.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    (commands,) = re.findall(r"```bash\n(.*?)```", page, flags=re.S)
    pytester.makepyfile(test_pipeline=code)
    for line in commands.strip().splitlines():
        argv = shlex.split(line)
        assert argv[:2] == ["pytest", "test_pipeline.py"]
        pytester.runpytest("-p", "no:cacheprovider", *argv[2:]).assert_outcomes(passed=2)
    (both,) = json.loads((pytester.path / "bench.json").read_text())["benchmarks"]  # the test with benchmark
    assert set(both["extra_info"]) == {"stallbench[torch]", "stallbench[again]"}
    assert both["stats"]["rounds"] == 1
