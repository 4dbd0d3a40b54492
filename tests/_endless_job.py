"""A job over a map-style dataset whose sampler never ends, run as its own process, as users restart.

``_endless_job.py save STATE OUT KIND WORKERS AT`` takes AT batches, saves ``state_dict()`` to STATE, and
records the next 12 batches in OUT. ``_endless_job.py load STATE OUT KIND WORKERS`` restores STATE in a new
process and records the first 12 batches it gives. KIND: ``sampler`` (``Endless``, drawn from its own
generator), ``stateful-batches`` (``StatefulBatches`` as ``batch_sampler=``), ``stateful-sampler``
(``StatefulIndices`` as ``sampler=``) or ``moving-sampler`` (``Moving``, whose state is its position, as
torchdata's StatefulDistributedSampler's is); a stateful one's own state is saved and restored beside the
loader's, as users of resumable samplers do. Before the saved epoch, an epoch is begun and dropped after one
batch. Both print nothing else. ``_endless_job.py batch MODE CASES`` runs many
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


class StatefulIndices(torch.utils.data.Sampler):
    """Shuffled passes over ``n`` indices forever, each pass seeded by the pass number, which its
    ``state_dict()`` keeps (as seeded resumable samplers do): no generator of torch's to draw again."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.passes = n, seed, 0

    def __iter__(self) -> Iterator[int]:
        while True:
            self.passes += 1
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.passes))
            yield from order.tolist()

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "passes": self.passes}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.passes = state["seed"], state["passes"]


class StatefulBatches(torch.utils.data.Sampler):
    """Batches of 4 from ``StatefulIndices`` forever: an endless batch sampler with a state of its own."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.indices = StatefulIndices(n, seed)

    def __iter__(self) -> Iterator[list[int]]:
        it = iter(self.indices)
        while True:
            yield [next(it) for _ in range(4)]

    def state_dict(self) -> dict[str, int]:
        return self.indices.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.indices.load_state_dict(state)


class Moving(torch.utils.data.Sampler):
    """A shuffled pass per epoch (``set_epoch``) whose ``state_dict()`` is the indices yielded in the current
    pass: loading it makes the next pass skip them (torchdata's StatefulDistributedSampler's contract)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.epoch, self.yielded, self.next_yielded = n, seed, 0, 0, None

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        self.yielded, self.next_yielded = self.next_yielded or 0, None
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        for i in order[self.yielded :].tolist():
            self.yielded += 1
            yield i

    def state_dict(self) -> dict[str, int]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_yielded = state["yielded"]


def make(kind: str, workers: int) -> tuple[DataLoader, torch.utils.data.Sampler]:
    """The loader and the sampler a user of ``kind`` makes."""
    if kind == "stateful-batches":
        sampler = StatefulBatches(1000, seed=3)
        return DataLoader(Squares(), batch_sampler=sampler, num_workers=workers), sampler
    kinds = {"stateful-sampler": StatefulIndices, "moving-sampler": Moving}
    sampler = kinds[kind](1000, seed=3) if kind in kinds else Endless(3)
    return DataLoader(Squares(), sampler=sampler, batch_size=5, num_workers=workers), sampler


def main(mode: str, state_file: str, out_file: str, kind: str, workers: str, at: str = "0") -> None:
    dl, sampler = make(kind, int(workers))
    own = kind != "sampler"
    if mode == "load" or kind != "moving-sampler" or at != "0":
        # an epoch begun and dropped. Not where a moving state is saved before the loader drew the epoch:
        # between passes such a state says where the dropped pass was left (torchdata's sampler's too)
        next(iter(dl))
    it = iter(dl)
    if mode == "save":
        for _ in range(int(at)):
            next(it)
        torch.save({"loader": dl.state_dict(), "sampler": sampler.state_dict() if own else None}, state_file)
    else:
        state = torch.load(state_file)
        if own:
            sampler.load_state_dict(state["sampler"])
        dl.load_state_dict(state["loader"])
        it = iter(dl)
    with open(out_file, "w") as f:
        json.dump([batch.tolist() for batch in itertools.islice(it, NEXT)], f)


if __name__ == "__main__":
    job_main(main, sys.argv[1:])
