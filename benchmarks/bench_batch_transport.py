"""How a batch gets from a forked worker to the training loop: torch's loader against ours, over a dataset
whose samples are a label and a float array (no cache, no decode: the transport alone).

Per sample: an int label and 8 floats (a batch of 64 is 2.6 kB: ours sends it by value), 512 floats (131 kB:
by value) and 2,048 floats (524 kB: ours stacks it into the batch ring). Torch's workers make a segment in
/dev/shm for each tensor and hand its descriptor over a socket. 2 workers, batch 64, persistent workers,
500 batches an epoch; one epoch first, then 5 timed epochs of each loader alternating in one process.
Target: torch/ours epoch time (median) >= 1.0 for each size: the path is never slower than torch's.

    python -m pytest benchmarks/bench_batch_transport.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import loader
from stallbench.report import plain_table

SAMPLES, BATCH, EPOCHS = 32_000, 64, 5
FLOATS = [8, 512, 2048]
ratios: dict[int, tuple[float, list[float], list[float]]] = {}


class Labelled(Dataset):
    def __init__(self, floats: int) -> None:
        self.floats = floats

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        return {"label": i, "features": np.full(self.floats, i, np.float32)}


def epoch_seconds(dl) -> float:
    start = time.perf_counter()
    for _ in dl:
        pass
    return time.perf_counter() - start


@pytest.mark.parametrize("floats", FLOATS)
def test_a_batch_comes_no_slower_than_through_torchs_loader(benchmark, floats: int) -> None:
    loaders = {
        name: make(Labelled(floats), batch_size=BATCH, num_workers=2, persistent_workers=True)
        for name, make in (("torch", torch.utils.data.DataLoader), ("ours", loader.DataLoader))
    }
    times: dict[str, list[float]] = {name: [] for name in loaders}

    def alternate() -> None:
        for name, dl in loaders.items():
            times[name].append(epoch_seconds(dl))

    for dl in loaders.values():
        epoch_seconds(dl)  # workers started, first batches made
    benchmark.pedantic(alternate, rounds=EPOCHS, warmup_rounds=0)
    while len(times["ours"]) < EPOCHS:  # benchmarks disabled: pedantic ran one round
        alternate()
    ratio = statistics.median(times["torch"]) / statistics.median(times["ours"])
    ratios[floats] = (ratio, times["torch"], times["ours"])
    assert ratio >= 1.0, f"{floats} floats a sample: torch/ours {ratio:.2f}"


def teardown_module() -> None:
    rows = [
        [f"{floats} floats", f"{ratio:.2f}", _spread(torch_s), _spread(ours_s)]
        for floats, (ratio, torch_s, ours_s) in sorted(ratios.items())
    ]
    print("\n" + plain_table(["sample", "torch/ours", "torch s (min-max)", "ours s (min-max)"], rows))


def _spread(seconds: list[float]) -> str:
    return f"{min(seconds):.3f}-{max(seconds):.3f}"
