"""A training-like job for memory tests, run as its own process (inside a cgroup by the test).

``_memory_job.py ROOT CACHE_DIR CACHE_BYTES EPOCHS`` reads the image folder ROOT (any bytes: the transform is
``len``) with 2 workers, shuffled, for EPOCHS epochs, with ``cache_bytes`` CACHE_BYTES (a number, ``auto`` or
``none``), and prints the loader's ``stats()`` as JSON plus the number of samples seen.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import loader


def main(root: str, cache_dir: str, cache_bytes: str, epochs: int) -> None:
    size = None if cache_bytes == "none" else cache_bytes if cache_bytes == "auto" else int(cache_bytes)
    dl = loader.DataLoader(
        loader.ImageFolder(root, transform=len),
        batch_size=16,
        shuffle=True,
        num_workers=2,
        cache_bytes=size,
        cache_dir=cache_dir,
    )
    samples = sum(len(labels) for _ in range(epochs) for _, labels in dl)
    print(json.dumps({"samples": samples, **dataclasses.asdict(dl.stats())}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
