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


def test_the_cache_advice_written_into_the_script_reads_through_the_cache(
    images: Path, tmp_path, shm_dir
) -> None:
    """The arguments stallbench's advice gives this script (its Dataset opens each JPEG itself), written in
    as a user would: one import changed and the two arguments added. Its reads go through the cache."""
    from loader import CachedFiles
    from stallbench.analysis.arguments import cache_arguments
    from stallbench.analysis.results import Workload

    sizes = dict(dataset_bytes=1 << 22, record_bytes=1 << 22, samples=200, batch_size=32, workers=2, epochs=2)
    workload = Workload(
        data=str(images), compute="the command's own step", cache_bytes=None, storage_bandwidth=None,
        memory_limit=None, opens_own_files=True, **sizes,
    )  # fmt: skip
    said = cache_arguments(1 << 22, workload)
    advice = re.fullmatch(r"cache_bytes=([\d_]+) \([^)]*\), cache_files=('[^']+')", said)
    assert advice, said
    edited = SCRIPT.read_text().replace(
        "from torch.utils.data import DataLoader, Dataset, DistributedSampler",
        "from torch.utils.data import Dataset, DistributedSampler\n\nfrom loader import DataLoader",
    )
    edited = edited.replace(
        '"pin_memory": pin}',
        f'"pin_memory": pin, "cache_bytes": {advice[1]}, "cache_files": {advice[2]}, '
        f'"cache_dir": {str(shm_dir)!r}}}',  # a private cache_dir for the test
    )
    assert edited.count("cache_files") == 1 and "from loader import DataLoader" in edited
    (tmp_path / "train_cnn_cached.py").write_text(edited)
    argv = [sys.executable, str(tmp_path / "train_cnn_cached.py"), "--data", str(images), "--epochs", "2"]
    env = {**_env(), "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": ""}
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert ran.returncode == 0 and len(_epoch_lines(ran.stdout)) == 2, ran.stderr[-3000:]
    files = CachedFiles(images, 1 << 22, shm_dir)  # the store the script filled, found again
    try:
        hits = sum(files.read(p)[1] for p in sorted(images.rglob("*.jpg")))
        assert hits == files.infos()[0].records_cached == 200
    finally:
        files.close()
