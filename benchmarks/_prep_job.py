"""The prep-bound job of bench_prep_bound.py: a user's loop over warm JPEGs with the train transform.

``_prep_job.py torch|ours DATA EPOCHS CACHE_DIR`` builds ``loader.ImageFolder(DATA, transform="train")`` and
one loader over that same dataset object: ``torch.utils.data.DataLoader`` or ``loader.DataLoader`` with a
cache that holds it all. A first, untimed epoch warms the data (page cache for torch's, our cache for ours);
then it prints one JSON line per timed epoch: images per second and CPU time per image. A fifth argument
``train`` adds a real training step per batch (a small CNN, SGD, on the CPU), as a user's loop has.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import torch

import loader
from loader.system.counters import cpu_seconds

BATCH, WORKERS = 64, 2


def make(kind: str, data: str, cache_dir: str) -> torch.utils.data.DataLoader:
    dataset = loader.ImageFolder(data, transform="train")
    common = dict(batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True)
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **common)
    cache_bytes = 2 * dataset.source.nbytes + (64 << 20)
    return loader.DataLoader(dataset, cache_bytes=cache_bytes, cache_dir=cache_dir, **common)


def small_cnn_step() -> Callable[[torch.Tensor, torch.Tensor], int]:
    """One SGD step of a small CNN on a uint8 batch; returns the batch's size."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 5, stride=4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(128, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(images: torch.Tensor, labels: torch.Tensor) -> int:
        loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return len(labels)

    return step


def main(kind: str, data: str, epochs: str, cache_dir: str, mode: str = "load") -> None:
    torch.manual_seed(0)
    dl = make(kind, data, cache_dir)
    step = small_cnn_step() if mode == "train" else (lambda images, labels: len(labels))
    sum(len(labels) for _, labels in dl)  # warm-up: workers started, data in memory
    for _ in range(int(epochs)):
        start, cpu = time.perf_counter(), cpu_seconds()
        images = sum(step(images, labels) for images, labels in dl)
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        rate, cpu_us = images / seconds, cpu / images * 1e6
        print(json.dumps({"loader": kind, "images_per_s": rate, "cpu_us_per_image": cpu_us}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
