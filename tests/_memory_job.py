"""A training-like job for memory tests, run as its own process (inside a cgroup by the test).

``_memory_job.py ROOT CACHE_DIR CACHE_BYTES EPOCHS [GROW_MIB]`` reads the image folder ROOT (any bytes: the
transform is ``len``) with 2 workers, shuffled, for EPOCHS epochs, with ``cache_bytes`` CACHE_BYTES (a number,
``auto`` or ``none``), and prints the loader's ``stats()`` as JSON plus the number of samples seen and the
records cached after epoch 1. With GROW_MIB, the job grows by that much from epoch 2 on, 2 MiB per step of
20 ms, as a job's own memory grows after its cache filled.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import loader


def main(root: str, cache_dir: str, cache_bytes: str, epochs: int, grow_mib: int = 0) -> None:
    size = None if cache_bytes == "none" else cache_bytes if cache_bytes == "auto" else int(cache_bytes)
    dl = loader.DataLoader(
        loader.ImageFolder(root, transform=len),
        batch_size=16,
        shuffle=True,
        num_workers=2,
        cache_bytes=size,
        cache_dir=cache_dir,
    )
    samples, grown, cached_after_epoch1 = 0, [], 0
    for epoch in range(1, epochs + 1):
        for _, labels in dl:
            samples += len(labels)
            if epoch >= 2 and 2 * len(grown) < grow_mib:
                grown.append(bytearray(b"x" * (2 << 20)))  # 2 MiB a step of 20 ms
                time.sleep(0.02)
        if epoch == 1:
            cached_after_epoch1 = dl.stats().records_cached
    stats = dataclasses.asdict(dl.stats())
    print(json.dumps({"samples": samples, "cached_after_epoch1": cached_after_epoch1, **stats}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:]))
