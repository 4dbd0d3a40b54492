"""One job of a coordinated group, as a user's script runs it: ``python _coordinated_job.py CONFIG.json``.

Prints ``ready`` when asked to wait for a go file, ``batch <epoch> <k>`` as it takes each batch (the tests
time their kills by it), then one JSON line per epoch: each batch's SHA-256 over all its tensors and the
sample indices it held; then its stats.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

import loader


class Indexed(torch.utils.data.Dataset):
    """Sample ``i`` is a tensor made from ``i`` and ``i`` itself: a batch says which samples it holds."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.002)  # some prep to share
        return torch.arange(48, dtype=torch.float32).reshape(3, 4, 4) * i, i


def dataset(config: dict) -> torch.utils.data.Dataset:
    if config["data"] == "indexed":
        return Indexed(config["samples"])
    return loader.ImageFolder(config["data"], transform=loader.TrainTransform(size=32))


def digest(batch) -> str:
    sha = hashlib.sha256()
    for t in batch:
        sha.update(t.numpy().tobytes())
    return sha.hexdigest()


def wait_for_go(config: dict) -> None:
    """Imports done, the job waits for the test's go (a file), so that it joins when the test chose."""
    if "go" in config:
        print("ready", flush=True)
        while not Path(config["go"]).exists():
            time.sleep(0.01)


def main(config: dict) -> None:
    wait_for_go(config)
    options = loader.Coordination(
        group=config.get("group"),
        min_members=config.get("min_members", 1),
        join_timeout=30.0,
        patience=config.get("patience", 30.0),
        staged_batches=config.get("staged", 16),
        staging_dir=config["staging"],
    )
    dl = loader.DataLoader(
        dataset(config),
        batch_size=8,
        shuffle=True,
        num_workers=config.get("workers", 1),
        persistent_workers=config.get("persistent", False) and config.get("workers", 1) > 0,
        coordinate=options,
    )
    for epoch in range(config["epochs"]):
        digests, indices = [], []
        for k, batch in enumerate(dl):
            print(f"batch {epoch} {k}", flush=True)
            digests.append(digest(batch))
            indices.append(batch[1].tolist() if config["data"] == "indexed" else [])
            time.sleep(config.get("step", 0.0))
        print(json.dumps({"epoch": epoch, "digests": digests, "indices": indices}), flush=True)
    stats = dataclasses.asdict(dl.stats().coordination)
    print(json.dumps({"stats": stats}), flush=True)


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
