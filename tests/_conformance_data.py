"""Module-level datasets and functions for tests/test_conformance.py: picklable, so spawned workers load them.

Nothing here imports ``loader``: a spawned worker of either DataLoader class unpickles only these and torch.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class Indexed(Dataset):
    """Sample i is i."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Records(Indexed):
    """Sample i is a dict of an int, a float, a string and a numpy array: what default_collate must merge."""

    def __getitem__(self, i: int) -> dict:
        return {"i": i, "x": i / 2, "name": f"r{i}", "a": np.arange(3) + i}


class Arrays(Indexed):
    """Sample i is a numpy array, which default_convert turns into a tensor."""

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(2, i, dtype=np.int64)


class Failing(Indexed):
    """Sample ``bad`` raises ValueError."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise ValueError(f"bad index {i}")
        return i


class Slow(Indexed):
    """Sample i takes ``delays.get(i, 0)`` seconds."""

    def __init__(self, n: int, delays: dict[int, float]) -> None:
        super().__init__(n)
        self.delays = delays

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delays.get(i, 0.0))
        return i


class Augmented(Indexed):
    """Sample i is i plus a random offset drawn from torch's RNG: reproducible only if workers are seeded."""

    def __getitem__(self, i: int) -> int:
        return i * 1000 + int(torch.randint(0, 1000, ()))


class WorkerSeed(Indexed):
    """Sample i is the torch seed of the process that loads it."""

    def __getitem__(self, i: int) -> int:
        return torch.initial_seed()


class SpawnCheck(Indexed):
    """Sample i is (i, whether pytest is loaded in the worker): a spawned worker starts without it."""

    def __getitem__(self, i: int) -> tuple[int, bool]:
        return i, "_pytest" in sys.modules


class Stream(IterableDataset):
    """Yields 0..n-1 in every process that iterates it (no sharding: each worker yields all of it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class ShardedStream(Stream):
    """Yields 0..n-1 split between the workers by ``get_worker_info()``, as torch's docs show."""

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


class SizedStream(Stream):
    """Yields 0..n-1 but reports ``claimed`` as its length."""

    def __init__(self, n: int, claimed: int) -> None:
        super().__init__(n)
        self.claimed = claimed

    def __len__(self) -> int:
        return self.claimed


class SeedStream(IterableDataset):
    """Each worker yields its id and its torch seed once."""

    def __iter__(self):
        info = get_worker_info()
        yield (info.id, info.seed) if info is not None else (-1, torch.initial_seed())


class RandomStream(IterableDataset):
    """Yields n random tensors: each one crosses from a worker to the main process as shared memory."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return (torch.randn(2, 2) for _ in range(self.n))


def double(x: int) -> int:
    return 2 * x


def failing_init(worker_id: int) -> None:
    raise RuntimeError(f"init failed in worker {worker_id}")


def loader_class(which: str) -> type:
    if which == "torch":
        return torch.utils.data.DataLoader
    from loader import DataLoader

    return DataLoader


def fd_limit_main(which: str, nofile: int, batches: int) -> None:
    """Prints, as JSON, what iterating ``batches`` tensors with a worker does under RLIMIT_NOFILE=``nofile``:
    first dropping each batch, then keeping all alive (each kept tensor holds a file descriptor)."""
    torch.multiprocessing.set_sharing_strategy("file_descriptor")
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    cls = loader_class(which)
    report = {}
    for keep in (False, True):
        kept, count = [], 0
        try:
            for t in cls(RandomStream(batches), num_workers=1, batch_size=None, timeout=60):
                count += 1
                if keep:
                    kept.append(t)
            report[str(keep)] = {"batches": count, "error": None}
        except RuntimeError as exc:
            hint = "ulimit -n" in str(exc) and "set_sharing_strategy" in str(exc)
            report[str(keep)] = {"error": type(exc).__name__, "hint": hint}
        del kept
    print(json.dumps(report))


class _Repeat:
    """timm's ``_RepeatSampler``: the wrapped sampler's epochs one after another, for good."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


def multi_epochs(cls: type) -> type:
    """timm's ``MultiEpochsDataLoader`` (timm/data/loader.py) over ``cls``: after ``__init__`` it swaps the
    sampler for an endless one, as torch's ``__setattr__`` rules allow, keeps one iterator for good and hands
    out ``len()`` batches of it per epoch."""

    class MultiEpochs(cls):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._DataLoader__initialized = False
            if self.batch_sampler is None:
                self.sampler = _Repeat(self.sampler)
            else:
                self.batch_sampler = _Repeat(self.batch_sampler)
            self._DataLoader__initialized = True
            self.iterator = super().__iter__()

        def __len__(self) -> int:
            return len(self.sampler) if self.batch_sampler is None else len(self.batch_sampler.sampler)

        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.iterator)

    return MultiEpochs


if __name__ == "__main__":
    fd_limit_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
