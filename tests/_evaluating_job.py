"""A training job as users write one, for the memory-limit tests: it evaluates after every epoch, and the
evaluation makes its memory jump. Run as its own process, inside a cgroup by the test.

``_evaluating_job.py KIND ROOT CACHE_BYTES EPOCHS EVAL_MIB [SOURCE]`` trains over the files of ROOT with
2 persistent workers, shuffled, batch 16: ``KIND`` ``torch`` (torch's DataLoader) or ``ours``
(``loader.DataLoader`` with ``cache_bytes`` CACHE_BYTES: a number, ``auto`` or ``none``), over ``SOURCE``
``files`` (default: the user's own Dataset, which opens each file itself, and ``cache_files=ROOT``),
``folder`` (``loader.ImageFolder``), ``coordinated`` (the same with ``coordinate=True``: its batches
staged for a group), ``prepared`` (the same with a staged transform, ``cache_form="prepared"``),
``partition`` (the same with ``partition_cache=True``, a world of one rank), ``no-workers`` (the user's
Dataset, no worker), or the same records converted beside ROOT: ``lmdb`` (ROOT/../lmdb), ``arrow``
(ROOT/../records.arrow), ``tar`` (ROOT/../shards), ``s3`` (``s3://data/train``, the endpoint in the
environment); torch's loader reads the files through the user's Dataset.
After each epoch an evaluation loader (torch's, 2 workers, forked then) reads a few files while the job
holds EVAL_MIB MiB more of its own, as a bigger evaluation batch or a checkpoint's copy would. Prints one
JSON line per epoch (samples seen, and for ours the loader's ``stats()``).
"""

from __future__ import annotations

import dataclasses
import json
import socket
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


def as_array(raw: bytes) -> np.ndarray:
    """The prepared form's deterministic stage: the record's bytes as an array, as large as the record."""
    return np.frombuffer(raw, np.uint8).copy()


def head_sum(prepared: np.ndarray) -> int:
    return int(prepared[:64].sum())


def records(root: Path, source: str) -> loader.SourceDataset:
    """The records of ROOT as ``source`` holds them (the module's docstring)."""
    if source == "lmdb":
        return loader.LMDBDataset(str(root.parent / "lmdb"), transform=len)
    if source == "arrow":
        return loader.ArrowDataset(str(root.parent / "records.arrow"), "image", "label", transform=len)
    if source == "tar":
        return loader.TarShards(str(root.parent / "shards"), transform=len)
    if source == "s3":
        return loader.ImageFolder("s3://data/train", transform=len)
    if source == "prepared":
        return loader.ImageFolder(str(root), transform=loader.Staged(as_array, head_sum))
    return loader.ImageFolder(str(root), transform=len)


def one_rank_world() -> None:
    """torch.distributed with this process as its only rank, on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def train_loader(kind: str, root: Path, cache_bytes: str, source: str) -> torch.utils.data.DataLoader:
    common = dict(batch_size=16, shuffle=True, num_workers=2, persistent_workers=True)
    if source == "no-workers":
        common.update(num_workers=0, persistent_workers=False)
    if kind == "torch":
        return torch.utils.data.DataLoader(Files(root), **common)
    size = None if cache_bytes == "none" else cache_bytes if cache_bytes == "auto" else int(cache_bytes)
    if source in ("files", "no-workers"):
        files = {"cache_files": str(root)} if size is not None else {}
        return loader.DataLoader(Files(root), cache_bytes=size, **files, **common)
    dataset, options = records(root, source), {}
    if source == "coordinated":
        options["coordinate"] = True
    elif source == "prepared" and size is not None:
        options["cache_form"] = "prepared"
    elif source == "partition":
        one_rank_world()
        common.pop("shuffle")
        sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=0)
        options.update(sampler=sampler, partition_cache=size is not None)
    return loader.DataLoader(dataset, cache_bytes=size, **options, **common)


def evaluate(root: Path, eval_mib: int) -> int:
    """An evaluation pass: a loader whose workers fork now, while the job holds ``eval_mib`` MiB more."""
    _held = np.ones(eval_mib * MIB, np.uint8)  # held to the end, every page written: the job's own memory
    return sum(len(labels) for _, labels in torch.utils.data.DataLoader(Files(root, 64), 16, num_workers=2))


def main(kind: str, root: str, cache_bytes: str, epochs: str, eval_mib: str, source: str = "files") -> None:
    dl = train_loader(kind, Path(root), cache_bytes, source)
    samples = 0
    for epoch in range(1, int(epochs) + 1):
        if isinstance(getattr(dl, "sampler", None), torch.utils.data.DistributedSampler):
            dl.sampler.set_epoch(epoch)
        samples += sum(len(labels) for _, labels in dl)
        evaluate(Path(root), int(eval_mib))
        stats = dataclasses.asdict(dl.stats()) if isinstance(dl, loader.DataLoader) else {}
        print(json.dumps({"epoch": epoch, "samples": samples, **stats}), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
