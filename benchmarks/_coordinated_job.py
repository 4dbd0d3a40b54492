"""One job of bench_coordinated.py: a hyper-parameter search trial over warm JPEGs, prep-bound.

``_coordinated_job.py torch|ours DATA EPOCHS GROUP JOBS`` builds ``loader.ImageFolder(DATA, "train")``
and one loader over it: ``torch.utils.data.DataLoader``, or ``loader.DataLoader(coordinate=...)`` in a group
of JOBS jobs. Each step sleeps STEP_S, as a GPU step leaves the CPU free; with a sixth argument ``train``
it is a real training step (a small CNN, SGD, on the CPU). After an untimed warm-up epoch it
prints one JSON line per timed epoch: images, wall-clock start and end, CPU seconds of the job's processes;
then ours prints its CoordinationStats.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import torch
from _prep_job import small_cnn_step  # the script's folder is on sys.path

import loader
from loader.system.counters import cpu_seconds

BATCH, WORKERS, STEP_S = 64, 2, 0.01


def make(kind: str, data: str, group: str, jobs: int) -> torch.utils.data.DataLoader:
    dataset = loader.ImageFolder(data, transform="train")
    common = dict(batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True)
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **common)
    return loader.DataLoader(dataset, coordinate=loader.Coordination(group=group, min_members=jobs), **common)


def emulated_step(images: torch.Tensor, labels: torch.Tensor) -> int:
    time.sleep(STEP_S)
    return len(labels)


def main(kind: str, data: str, epochs: str, group: str, jobs: str, mode: str = "emulated") -> None:
    torch.manual_seed(0)
    dl = make(kind, data, group, int(jobs))
    step = small_cnn_step() if mode == "train" else emulated_step
    sum(step(images, labels) for images, labels in dl)  # warm-up: workers started, files in the page cache
    for _ in range(int(epochs)):
        start, cpu = time.time(), cpu_seconds()
        images = sum(step(images, labels) for images, labels in dl)
        end, cpu = time.time(), cpu_seconds() - cpu
        print(
            json.dumps({"loader": kind, "images": images, "start": start, "end": end, "cpu_s": cpu}),
            flush=True,
        )
    if kind == "ours":
        print(json.dumps({"stats": dataclasses.asdict(dl.stats().coordination)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
