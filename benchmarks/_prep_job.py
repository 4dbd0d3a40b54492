"""The prep-bound job of bench_prep_bound.py: a user's loop over warm JPEGs with the train transform.

``_prep_job.py torch|ours DATA EPOCHS CACHE_DIR`` builds ``loader.ImageFolder(DATA, transform="train")`` and
one loader over that same dataset object: ``torch.utils.data.DataLoader`` or ``loader.DataLoader`` with a
cache that holds it all. A first, untimed epoch warms the data (page cache for torch's, our cache for ours);
then it prints one JSON line per timed epoch: images per second and CPU time per image.
"""

from __future__ import annotations

import json
import sys
import time

import psutil
import torch

import loader

BATCH, WORKERS = 64, 2


def make(kind: str, data: str, cache_dir: str) -> torch.utils.data.DataLoader:
    dataset = loader.ImageFolder(data, transform="train")
    common = dict(batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True)
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **common)
    cache_bytes = 2 * dataset.source.nbytes + (64 << 20)
    return loader.DataLoader(dataset, cache_bytes=cache_bytes, cache_dir=cache_dir, **common)


def main(kind: str, data: str, epochs: str, cache_dir: str) -> None:
    torch.manual_seed(0)
    dl = make(kind, data, cache_dir)
    sum(len(labels) for _, labels in dl)  # warm-up: workers started, data in memory
    for _ in range(int(epochs)):
        start, cpu = time.perf_counter(), cpu_seconds()
        images = sum(len(labels) for _, labels in dl)
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        rate, cpu_us = images / seconds, cpu / images * 1e6
        print(json.dumps({"loader": kind, "images_per_s": rate, "cpu_us_per_image": cpu_us}), flush=True)


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its workers."""
    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


if __name__ == "__main__":
    main(*sys.argv[1:])
