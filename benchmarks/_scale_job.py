"""One measurement of bench_scale.py in a process of its own, as a job's run starts: printed as JSON.

``first-batch``: the time to build the dataset, then to make the loader (2 workers, batch 256, shuffled) and
get its first batch. ``hit-cpu``: the CPU time per record of a second pass over ``SAMPLE`` records (or all)
chosen at random (the first pass reads them: into our cache, or torch's page cache), in this process (no
workers), so the figure is the loader's own path for a record the cache holds.

Loaders: ``torch``, torch's DataLoader over the Dataset a user writes: for files, torchvision's
``ImageFolder`` listing (``os.walk``, sorted, extensions checked; torchvision itself does not import beside
this torch, so its listing is written out here), reading each file; for an LMDB, the environment opened in
each process and ``txn.get`` by key. ``ours``: our ``ImageFolder`` / ``LMDBDataset`` under our DataLoader
(``cache_bytes="auto"``). ``ours-files``: the user's files Dataset under our DataLoader with
``cache_files=`` (the one-import path).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import lmdb
import torch

from loader import DataLoader, ImageFolder, LMDBDataset  # imported before the clock starts, as torch is
from loader.cache import index_bytes
from loader.sources.lmdb_source import LABELS_KEY, LEN_KEY, record_key

SAMPLE = 20_000
EXTENSIONS = (".jpg", ".jpeg", ".png")


class UserFolder(torch.utils.data.Dataset):
    """torchvision's ``ImageFolder`` listing and a plain read: ``(bytes, label)``."""

    def __init__(self, root: str) -> None:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = []
        for label, name in enumerate(classes):
            for folder, _, names in sorted(os.walk(os.path.join(root, name), followlinks=True)):
                for file in sorted(names):
                    if file.lower().endswith(EXTENSIONS):
                        self.samples.append((os.path.join(folder, file), label))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        path, label = self.samples[index]
        with open(path, "rb") as f:
            return f.read(), label


class UserLMDB(torch.utils.data.Dataset):
    """An LMDB Dataset as users write one: the environment opened lazily in each process."""

    def __init__(self, path: str) -> None:
        self.path, self.env = path, None
        with lmdb.open(path, readonly=True, lock=False) as env, env.begin() as txn:
            self.length = int(txn.get(LEN_KEY))
            self.labels = txn.get(LABELS_KEY)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)
        with self.env.begin() as txn:
            value = txn.get(record_key(index))
        return value[4:], int.from_bytes(self.labels[4 * index : 4 * index + 4], "big", signed=True)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "env": None}


def dataset(fmt: str, kind: str, data: str) -> torch.utils.data.Dataset:
    if kind == "ours":
        return LMDBDataset(data, transform=None) if fmt == "lmdb" else ImageFolder(data, None)
    return UserLMDB(data) if fmt == "lmdb" else UserFolder(data)


def make_loader(ds, kind: str, data: str, cache_dir: str, **options) -> torch.utils.data.DataLoader:
    if kind == "torch":
        return torch.utils.data.DataLoader(ds, **options)
    files = dict(cache_files=data) if kind == "ours-files" else {}
    return DataLoader(ds, cache_bytes="auto", cache_dir=cache_dir, **files, **options)


def first_batch(fmt: str, kind: str, data: str, cache_dir: str) -> dict:
    start = time.perf_counter()
    ds = dataset(fmt, kind, data)
    built = time.perf_counter()
    dl = make_loader(ds, kind, data, cache_dir, batch_size=256, shuffle=True, num_workers=2)
    batch = next(iter(dl))
    done = time.perf_counter()
    assert len(batch[0]) == 256
    return {"build": built - start, "first_batch": done - start, "records": len(ds)}


def hit_cpu(fmt: str, kind: str, data: str, cache_dir: str) -> dict:
    ds = dataset(fmt, kind, data)
    indices = random.Random(0).sample(range(len(ds)), min(SAMPLE, len(ds)))
    dl = make_loader(ds, kind, data, cache_dir, batch_size=64, sampler=indices)
    nbytes = sum(len(raw) for records, _ in dl for raw in records)  # into our cache, or the page cache
    before = stats(dl, len(ds), nbytes / len(indices))
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in dl:
        pass
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    after = stats(dl, len(ds), nbytes / len(indices))
    if after:
        after.update(hits=after["hits"] - before["hits"], misses=after["misses"] - before["misses"])
    return {"cpu_us": cpu / len(indices) * 1e6, "wall_us": wall / len(indices) * 1e6, **after}


def stats(dl, records: int, record_bytes: float) -> dict:
    """Our loader's hits and misses, its cache's index bytes per record of the dataset, and the bytes its
    store holds per record held against the records' own (``record_bytes`` on average); nothing for
    torch's."""
    if not isinstance(dl, DataLoader):
        return {}
    got, index = dl.stats(), index_bytes(records)
    return {
        "hits": got.hits,
        "misses": got.misses,
        "index_bytes_per_record": index / records,
        "store_bytes_per_record": (got.cache_bytes_used - index) / max(1, got.records_cached),
        "record_bytes": record_bytes,
    }


if __name__ == "__main__":
    measure, fmt, kind, data, cache_dir = sys.argv[1:6]
    print(json.dumps({"first-batch": first_batch, "hit-cpu": hit_cpu}[measure](fmt, kind, data, cache_dir)))
