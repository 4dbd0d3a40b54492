"""The prep-bound job of bench_prep_bound.py: a user's loop over warm JPEGs with the train or eval transform.

``_prep_job.py KIND DATA EPOCHS CACHE_DIR [MODE] [TRANSFORM]`` builds ``loader.ImageFolder(DATA,
transform=TRANSFORM)`` ("train" by default) and one loader over that same dataset object, by KIND:
``torch`` (torch.utils.data.DataLoader), ``raw`` (loader.DataLoader holding raw records, room for all of
them: the cache as it was before prepared records), ``prepared`` (loader.DataLoader, ``cache_form="auto"``,
room for every record prepared) or ``partial`` (the same with room for half of them prepared: "auto" holds
a mix). A first, untimed epoch warms the data (page cache for torch's, our cache for ours); then it prints
one JSON line per timed epoch: images per second, CPU time per image and the form the cache chose. MODE
``train`` adds a real training step per batch (a small CNN, SGD, on the CPU), as a user's loop has;
``gpu`` a ResNet-18 step on the GPU (forward and backward in bfloat16 autocast, SGD), and each epoch's line
then gives the share of its time the GPU spent on the steps (CUDA events around each step's work, summed
once the epoch is over); ``load`` (default) neither.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import loader
from loader.system.counters import cpu_seconds

BATCH, WORKERS = 64, 2


PREPARED_BYTES = {"train": 500 * 375 * 3 + 256, "eval": 3 * 224 * 224 + 256}  # a record prepared, with header


def make(kind: str, data: str, cache_dir: str, transform: str = "train") -> torch.utils.data.DataLoader:
    dataset = loader.ImageFolder(data, transform=transform)
    common = dict(batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True)
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **common)
    index = 64 << 20
    room = {
        "raw": 2 * dataset.source.nbytes,
        "prepared": len(dataset) * PREPARED_BYTES[transform],
        "partial": len(dataset) * PREPARED_BYTES[transform] // 2,
    }[kind]
    form = "raw" if kind == "raw" else "auto"
    own = Path(cache_dir) / kind  # each kind its own store: "partial" must not find "prepared"'s, bigger
    own.mkdir(mode=0o700, exist_ok=True)
    return loader.DataLoader(dataset, cache_bytes=index + room, cache_dir=own, cache_form=form, **common)


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


class GpuStep:
    """One ResNet-18 SGD step per batch on the GPU, the GPU's time on each timed by CUDA events."""

    def __init__(self) -> None:
        from _resnet import resnet18

        self.model = resnet18(10).cuda().to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> int:
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        images = images.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        began.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.model(images.float() / 255), labels.cuda())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        ended.record()
        self.events.append((began, ended))
        return len(labels)

    def busy_seconds(self) -> float:
        """The GPU's seconds on the steps since the last call (waits for them to finish)."""
        torch.cuda.synchronize()
        seconds = sum(began.elapsed_time(ended) for began, ended in self.events) / 1000
        self.events = []
        return seconds


def main(
    kind: str, data: str, epochs: str, cache_dir: str, mode: str = "load", transform: str = "train"
) -> None:
    torch.manual_seed(0)
    dl = make(kind, data, cache_dir, transform)
    form = dl.stats().cache_form if isinstance(dl, loader.DataLoader) else "page cache"
    steps = {"train": small_cnn_step, "gpu": GpuStep}
    step = steps[mode]() if mode in steps else (lambda images, labels: len(labels))
    sum(step(images, labels) for images, labels in dl)  # warm-up: workers started, data in memory
    busy = getattr(step, "busy_seconds", None)
    if busy is not None:
        busy()
    for _ in range(int(epochs)):
        start, cpu = time.perf_counter(), cpu_seconds()
        images = sum(step(images, labels) for images, labels in dl)
        if busy is not None:
            torch.cuda.synchronize()
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        rate, cpu_us = images / seconds, cpu / images * 1e6
        line = {"loader": kind, "images_per_s": rate, "cpu_us_per_image": cpu_us, "form": form}
        if busy is not None:
            line["gpu_busy_share"] = busy() / seconds
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
