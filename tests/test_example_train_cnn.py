"""examples/train_cnn.py: the plain user script that ``stallbench analyze`` runs, alone and under torchrun.

It has to stay a script a user could have written: no stallbench, no ``loader``, exit 0, one line per epoch.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stallbench.workloads import make_jpeg_folder

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_cnn.py"
EPOCH_LINE = re.compile(r"^epoch (\d+): train loss \d+\.\d\d, eval accuracy (\d\.\d\d|n/a), (\d+) batches$")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_jpeg_folder(
        tmp_path_factory.mktemp("train_cnn") / "images", num_images=200, num_classes=4, width=32, height=24
    )


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_cnn_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error"}


def _run(prefix: list[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=_env(), cwd=ROOT
    )


def _epoch_lines(stdout: str) -> list[re.Match]:
    return [m for line in stdout.splitlines() if (m := EPOCH_LINE.match(line))]


def test_script_imports_neither_stallbench_nor_loader() -> None:
    tree = ast.parse(SCRIPT.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {n.split(".")[0] for n in names} & {"stallbench", "loader", "torchvision"}


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.multiproc)])
def test_trains_and_prints_one_line_per_epoch(images: Path, workers: int) -> None:
    args = ["--data", str(images), "--epochs", "2", "--batch-size", "32", "--workers", str(workers)]
    done = _run([sys.executable], *args)
    assert done.returncode == 0, done.stderr
    lines = _epoch_lines(done.stdout)
    # 200 images, 20 held out: 180 to train in batches of 32
    assert [(m[1], m[3]) for m in lines] == [("1", "6"), ("2", "6")], done.stdout
    assert all(m[2] != "n/a" for m in lines)


@pytest.mark.multiproc
def test_runs_under_torchrun_with_only_rank_0_printing(images: Path) -> None:
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = _run(prefix, "--data", str(images), "--epochs", "2", "--batch-size", "32", "--workers", "0")
    assert done.returncode == 0, done.stderr
    # each rank trains on half of the 180 images: 90 in batches of 32
    assert [(m[1], m[3]) for m in _epoch_lines(done.stdout)] == [("1", "3"), ("2", "3")], done.stdout


def test_bad_argument_is_named_before_any_work(tmp_path: Path) -> None:
    done = _run([sys.executable], "--data", str(tmp_path), "--eval-fraction", "1.5")
    assert done.returncode == 2
    assert "--eval-fraction" in done.stderr and "1.5" in done.stderr


def test_dataset_flips_only_when_training(example, images: Path) -> None:
    samples, classes = example.list_images(images)
    assert len(samples) == 200 and len(classes) == 4
    train = example.ImageFolderDataset(samples[:1] * 32, size=16, train=True)
    held = example.ImageFolderDataset(samples[:1] * 32, size=16, train=False)
    x, label = held[0]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and label == samples[0][1]
    assert all(torch.equal(held[i][0], x) for i in range(32))
    seen = [train[i][0] for i in range(32)]
    flipped = [torch.equal(t, x.flip(-1)) for t in seen]
    assert 0 < sum(flipped) < 32
    assert all(f or torch.equal(t, x) for t, f in zip(seen, flipped, strict=True))
