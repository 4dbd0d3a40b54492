"""A training job over a cached ImageFolder that a test kills whole (every process, SIGKILL) mid-epoch, then
runs again as a user restarts it: ``_crashed_job.py DATA CACHE_DIR EPOCHS`` prints one line per batch (the
SHA-256 of its images and its labels) and, at the end, its loader's hits and misses as JSON."""

from __future__ import annotations

import hashlib
import json
import sys

from loader import DataLoader, ImageFolder


def fingerprint(images, labels) -> str:
    return hashlib.sha256(images.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()


if __name__ == "__main__":
    data, cache_dir, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dataset = ImageFolder(data, transform="eval")
    dl = DataLoader(
        dataset, batch_size=4, num_workers=2, cache_bytes="auto", cache_dir=cache_dir, cache_form="raw"
    )
    for _ in range(epochs):
        for images, labels in dl:
            print(fingerprint(images, labels), flush=True)
    stats = dl.stats()
    print(json.dumps({"hits": stats.hits, "misses": stats.misses}), flush=True)
