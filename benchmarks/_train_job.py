"""The real-job check of bench_real_job.py: a small CNN trained on small JPEGs, timed from a cold start.

``_train_job.py torch|ours DATA EPOCHS CACHE_DIR CACHE_BYTES`` trains a small CNN (SGD, CPU) with
``loader.ImageFolder(DATA, transform="train")``, 2 workers, shuffled, through ``torch.utils.data.DataLoader``
or ``loader.DataLoader(cache_bytes=CACHE_BYTES)`` (a number or ``auto``). It prints one JSON line per epoch:
seconds, the kernel's storage bytes for the job's processes, the mean loss, and a digest of the labels seen in
order (the same for both loaders: the same batches).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import torch
from _prep_job import small_cnn_step

import loader
from loader.system.counters import storage_read_bytes


def make(kind: str, data: str, cache_dir: str, cache_bytes: str) -> torch.utils.data.DataLoader:
    dataset = loader.ImageFolder(data, transform="train")
    generator = torch.Generator().manual_seed(0)
    common = dict(batch_size=64, shuffle=True, num_workers=2, persistent_workers=True, generator=generator)
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **common)
    size = cache_bytes if cache_bytes == "auto" else int(cache_bytes)
    return loader.DataLoader(dataset, cache_bytes=size, cache_dir=cache_dir, **common)


def main(kind: str, data: str, epochs: str, cache_dir: str, cache_bytes: str) -> None:
    torch.manual_seed(0)
    dl = make(kind, data, cache_dir, cache_bytes)
    step = small_cnn_step()
    for epoch in range(1, int(epochs) + 1):
        start, read = time.perf_counter(), storage_read_bytes()
        digest, images = hashlib.sha256(), 0
        for batch_images, labels in dl:
            images += step(batch_images, labels)
            digest.update(labels.numpy().tobytes())
        seconds = time.perf_counter() - start
        record = {"loader": kind, "epoch": epoch, "seconds": seconds, "images": images}
        record.update(storage_bytes=storage_read_bytes() - read, labels=digest.hexdigest()[:16])
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
