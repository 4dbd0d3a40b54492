"""A training job as users write one, for the memory-limit tests: it evaluates after every epoch, and the
evaluation makes its memory jump. Run as its own process, inside a cgroup by the test.

``_evaluating_job.py KIND ROOT CACHE_BYTES EPOCHS EVAL_MIB [SOURCE]`` trains over the files of ROOT with
2 persistent workers, shuffled, batch 16: ``KIND`` ``torch`` (torch's DataLoader) or ``ours``
(``loader.DataLoader`` with ``cache_bytes`` CACHE_BYTES: a number, ``auto`` or ``none``), over ``SOURCE``
``files`` (default: the user's own Dataset, which opens each file itself, and ``cache_files=ROOT``),
``folder`` (``loader.ImageFolder``) or ``coordinated`` (the same with ``coordinate=True``: its batches
staged for a group); torch's loader reads the same files through the user's Dataset.
After each epoch an evaluation loader (torch's, 2 workers, forked then) reads a few files while the job
holds EVAL_MIB MiB more of its own, as a bigger evaluation batch or a checkpoint's copy would. Prints one
JSON line per epoch (samples seen, and for ours the loader's ``stats()``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

import loader

MIB = 1 << 20


class Files(torch.utils.data.Dataset):
    """A folder's files, each opened by path and read whole, as a user's Dataset does."""

    def __init__(self, root: Path, limit: int | None = None) -> None:
        self.paths = sorted(p for p in root.rglob("*") if p.is_file())[:limit]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with open(self.paths[i], "rb") as f:
            raw = f.read()
        return torch.frombuffer(bytearray(raw[:64].ljust(64, b"\0")), dtype=torch.uint8), len(raw)


def train_loader(kind: str, root: Path, cache_bytes: str, source: str) -> torch.utils.data.DataLoader:
    common = dict(batch_size=16, shuffle=True, num_workers=2, persistent_workers=True)
    if kind == "torch":
        return torch.utils.data.DataLoader(Files(root), **common)
    size = None if cache_bytes == "none" else cache_bytes if cache_bytes == "auto" else int(cache_bytes)
    if source in ("folder", "coordinated"):
        folder = loader.ImageFolder(str(root), transform=len)
        return loader.DataLoader(folder, cache_bytes=size, coordinate=source == "coordinated", **common)
    files = {"cache_files": str(root)} if size is not None else {}
    return loader.DataLoader(Files(root), cache_bytes=size, **files, **common)


def evaluate(root: Path, eval_mib: int) -> int:
    """An evaluation pass: a loader whose workers fork now, while the job holds ``eval_mib`` MiB more."""
    _held = np.ones(eval_mib * MIB, np.uint8)  # held to the end, every page written: the job's own memory
    return sum(len(labels) for _, labels in torch.utils.data.DataLoader(Files(root, 64), 16, num_workers=2))


def main(kind: str, root: str, cache_bytes: str, epochs: str, eval_mib: str, source: str = "files") -> None:
    dl = train_loader(kind, Path(root), cache_bytes, source)
    samples = 0
    for epoch in range(1, int(epochs) + 1):
        samples += sum(len(labels) for _, labels in dl)
        evaluate(Path(root), int(eval_mib))
        stats = dataclasses.asdict(dl.stats()) if isinstance(dl, loader.DataLoader) else {}
        print(json.dumps({"epoch": epoch, "samples": samples, **stats}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
