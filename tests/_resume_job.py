"""A job that saves its loader's state, or restarts from it: run as its own process, as users restart.

``_resume_job.py save STATE OUT WORKERS PERSISTENT AT [KIND DATA]`` runs one epoch, then the next up to batch
AT (its length: after its last batch; 0: the iterator made, no batch taken), saves ``state_dict()`` to STATE,
and records the rest of that epoch and two more in OUT. ``_resume_job.py load STATE OUT WORKERS PERSISTENT
MORE [KIND DATA]`` restores STATE in a new process and records what its first iterator gives (the rest of the
saved epoch, or the next one) and MORE epochs after it. ``_resume_job.py relay STATE OUT WORKERS PERSISTENT
TAKE [KIND DATA]`` restores STATE, records TAKE batches and saves its own state over STATE: a job restarted
once more. ``_resume_job.py batch MODE CASES`` runs many cases in one process (``_job_batch``).

KIND: ``index`` (the default: each sample its record's index), ``drawn`` (the index and a draw from each
of ``torch``, ``random`` and ``numpy``, as a user's augmentation draws) or ``train`` (the JPEGs under DATA
through our ``"train"`` transform: random resized crop and flip). A batch is recorded whole: its values, or
for images the SHA-256 of every tensor's bytes.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys

import numpy as np
import torch
from _job_batch import job_main
from helpers import MemorySource, first_index

from loader import DataLoader, ImageFolder, SourceDataset


def drawn(raw) -> torch.Tensor:
    """A sample that shows the random draws of its worker: index, torch, random, numpy."""
    return torch.tensor(
        [first_index(raw), torch.rand(()).item(), random.random(), np.random.rand()], dtype=torch.float64
    )


def make(workers: int, persistent: bool, kind: str, data: str | None) -> DataLoader:
    if kind == "train":
        dataset = ImageFolder(data, transform="train")
    else:
        dataset = SourceDataset(MemorySource(40), transform=drawn if kind == "drawn" else first_index)
    return DataLoader(
        dataset,
        batch_size=3,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
        generator=torch.Generator().manual_seed(7),
    )


def record(batch, kind: str) -> object:
    if kind == "train":
        images, labels = batch
        return [hashlib.sha256(image.numpy().tobytes()).hexdigest() for image in images] + labels.tolist()
    return batch[0].tolist()  # the samples; their labels follow from the records


def epochs(dl: DataLoader, it, count: int, kind: str) -> list:
    out = [record(b, kind) for b in it]
    for _ in range(count):
        out += [record(b, kind) for b in dl]
    return out


def main(
    mode: str, state_file: str, out_file: str, workers: str, persistent: str, count: str, kind: str = "index",
    data: str | None = None,
) -> None:  # fmt: skip
    dl = make(int(workers), persistent == "1", kind, data)
    if mode == "save":
        list(dl)  # a whole epoch first: the saved state is not the loader's start
        it = iter(dl)
        for _ in range(int(count)):
            next(it)
        torch.save(dl.state_dict(), state_file)
        rest = epochs(dl, it, 2, kind)
    elif mode == "relay":
        dl.load_state_dict(torch.load(state_file))
        it = iter(dl)
        rest = [record(next(it), kind) for _ in range(int(count))]
        torch.save(dl.state_dict(), state_file)
    else:
        dl.load_state_dict(torch.load(state_file))
        rest = epochs(dl, iter(dl), int(count), kind)
    with open(out_file, "w") as f:
        json.dump(rest, f)


if __name__ == "__main__":
    job_main(main, sys.argv[1:])
