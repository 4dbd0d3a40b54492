"""A job that saves its loader's state, or restarts from it: run as its own process, as users restart.

``_resume_job.py save STATE OUT WORKERS PERSISTENT AT`` runs one epoch, then the next up to batch AT (its
length: after its last batch), saves ``state_dict()`` to STATE, and records the rest of that epoch and two
more in OUT. ``_resume_job.py load STATE OUT WORKERS PERSISTENT MORE`` restores STATE in a new process and
records what its first iterator gives (the rest of the saved epoch, or the next one) and MORE epochs after it.
"""

from __future__ import annotations

import json
import sys

import torch
from helpers import MemorySource, first_index

from loader import DataLoader, SourceDataset


def make(workers: int, persistent: bool) -> DataLoader:
    return DataLoader(
        SourceDataset(MemorySource(40), transform=first_index),
        batch_size=3,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
        generator=torch.Generator().manual_seed(7),
    )


def epochs(dl: DataLoader, it, count: int) -> list[list[int]]:
    out = [b[0].tolist() for b in it]
    for _ in range(count):
        out += [b[0].tolist() for b in dl]
    return out


def main(mode: str, state_file: str, out_file: str, workers: str, persistent: str, count: str) -> None:
    dl = make(int(workers), persistent == "1")
    if mode == "save":
        list(dl)  # a whole epoch first: the saved state is not the loader's start
        it = iter(dl)
        for _ in range(int(count)):
            next(it)
        torch.save(dl.state_dict(), state_file)
        rest = epochs(dl, it, 2)
    else:
        dl.load_state_dict(torch.load(state_file))
        rest = epochs(dl, iter(dl), int(count))
    with open(out_file, "w") as f:
        json.dump(rest, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
