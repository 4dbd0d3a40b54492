"""A job over a map-style dataset whose sampler never ends, run as its own process, as users restart.

``_endless_job.py save STATE OUT WORKERS AT`` takes AT batches, saves ``state_dict()`` to STATE, and records
the next 12 batches in OUT. ``_endless_job.py load STATE OUT WORKERS`` restores STATE in a new process and
records the first 12 batches it gives. Both print nothing else. ``_endless_job.py batch MODE CASES`` runs many
cases in one process (``_job_batch``).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator

import torch
from _job_batch import job_main

from loader import DataLoader

NEXT = 12


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> int:
        return i * i


class Endless(torch.utils.data.Sampler):
    """Random indices forever, from its own generator (as iteration-based training loops draw them)."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[int]:
        while True:
            yield from torch.randint(1000, (16,), generator=self.generator).tolist()


def make(workers: int) -> DataLoader:
    return DataLoader(Squares(), sampler=Endless(3), batch_size=5, num_workers=workers)


def main(mode: str, state_file: str, out_file: str, workers: str, at: str = "0") -> None:
    dl = make(int(workers))
    it = iter(dl)
    if mode == "save":
        for _ in range(int(at)):
            next(it)
        torch.save(dl.state_dict(), state_file)
    else:
        dl.load_state_dict(torch.load(state_file))
        it = iter(dl)
    with open(out_file, "w") as f:
        json.dump([batch.tolist() for batch in itertools.islice(it, NEXT)], f)


if __name__ == "__main__":
    job_main(main, sys.argv[1:])
