"""Heavy-tailed prep: 1% of the samples take ~50x the others to prepare. Torch's loader against ours with
``ready_first=True`` (and torch's own ``in_order=False`` beside them), p99 batch wait and epoch time.

A folder of 3,200 small JPEGs (256x256) holds 32 large ones (1800x1800, ~50x the pixels and the decode
time: 0.24 ms against 11-22 ms here): a scraped dataset's few huge images. Each sample is decoded, made RGB
and resized to 64x64 (PIL), as a transform does. The step is a sleep (a GPU's step leaves the cores to the
workers): 80% of the time torch's loader takes a batch with no step, so the loader keeps up on average with
little to spare, as a tuned job's does. 2 workers, batch 32;
3 rounds, each loader one epoch a round in turn, each epoch with workers started anew. The wait of each
batch but the first (workers starting) is timed in the loop.
Target: torch/ours p99 batch wait >= 3 and torch/ours epoch time >= 1.3 (medians over the rounds).

    python -m pytest benchmarks/bench_slow_samples.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset

import loader
from stallbench.report import plain_table

SAMPLES, LARGE_EVERY, BATCH, WORKERS, ROUNDS = 3_200, 100, 32, 2, 3
STEP_SHARE = 0.8
SMALL, LARGE, OUT = 256, 1800, 64
results: dict[str, dict[str, list[float]]] = {}


def heavy_tailed_folder(root: Path) -> Path:
    """``SAMPLES`` JPEGs, every ``LARGE_EVERY``-th one large, made once."""
    folder = root / f"heavy-tailed-{SAMPLES}-{SMALL}-{LARGE}"
    if (folder / "done").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(SAMPLES):
        side = LARGE if i % LARGE_EVERY == 0 else SMALL
        pixels = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8)  # blocks: a JPEG's detail
        Image.fromarray(pixels).resize((side, side)).save(folder / f"{i:05d}.jpg", quality=90)
    (folder / "done").touch()
    return folder


class Decoded(Dataset):
    def __init__(self, folder: Path) -> None:
        self.paths = sorted(folder.glob("*.jpg"))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        with Image.open(self.paths[i]) as image:
            small = image.convert("RGB").resize((OUT, OUT))
        return torch.from_numpy(np.asarray(small).copy()).permute(2, 0, 1)


def step_seconds(dl) -> float:
    """``STEP_SHARE`` of the time torch's loader takes a batch with no step: the loader keeps up on average,
    with the little to spare that jobs have, and a slow sample's burst is what can stall the step."""
    epoch, _ = run_epoch(dl, 0.0)
    return STEP_SHARE * epoch / len(dl)


def run_epoch(dl, step: float) -> tuple[float, float]:
    """(epoch seconds, p99 of the batch waits but the first), every sample checked to come once."""
    waits, seen = [], 0
    start = time.perf_counter()
    it = iter(dl)
    while True:
        asked = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - asked)
        seen += len(batch)
        time.sleep(step)
    assert seen == SAMPLES
    return time.perf_counter() - start, float(np.percentile(waits[1:], 99))


@pytest.fixture(scope="module")
def folder(bench_data_root: Path) -> Path:
    return heavy_tailed_folder(bench_data_root)


def test_a_slow_sample_holds_no_batch_with_ready_first(benchmark, folder: Path) -> None:
    ds = Decoded(folder)
    common = {"batch_size": BATCH, "num_workers": WORKERS, "shuffle": True}
    loaders = {
        "torch": torch.utils.data.DataLoader(ds, **common),
        "torch in_order=False": torch.utils.data.DataLoader(ds, in_order=False, **common),
        "ours ready_first": loader.DataLoader(ds, ready_first=True, **common),
    }
    step = step_seconds(loaders["torch"])
    for name in loaders:
        results[name] = {"epoch": [], "p99": []}

    def one_round() -> None:
        for name, dl in loaders.items():
            epoch, p99 = run_epoch(dl, step)
            results[name]["epoch"].append(epoch)
            results[name]["p99"].append(p99)

    benchmark.pedantic(one_round, rounds=ROUNDS, warmup_rounds=0)
    while len(results["torch"]["epoch"]) < ROUNDS:  # benchmarks disabled: pedantic ran one round
        one_round()
    results["step"] = {"epoch": [step], "p99": [step]}
    p99 = _median("torch", "p99") / _median("ours ready_first", "p99")
    epoch = _median("torch", "epoch") / _median("ours ready_first", "epoch")
    assert p99 >= 3.0 and epoch >= 1.3, f"torch/ours p99 wait {p99:.2f}, epoch {epoch:.2f}"


def _median(name: str, figure: str) -> float:
    return statistics.median(results[name][figure])


def teardown_module() -> None:
    step = results.pop("step", {"epoch": [float("nan")]})["epoch"][0]
    rows = [
        [
            name,
            _spread(figures["epoch"]),
            _spread([1e3 * s for s in figures["p99"]]),
            f"{_median('torch', 'epoch') / _median(name, 'epoch'):.2f}",
            f"{_median('torch', 'p99') / _median(name, 'p99'):.2f}",
        ]
        for name, figures in results.items()
    ]
    print(f"\nstep {1e3 * step:.1f} ms a batch (a sleep)")
    headers = ["loader", "epoch s (min-max)", "p99 wait ms (min-max)", "torch/it epoch", "torch/it p99"]
    print(plain_table(headers, rows))


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"
