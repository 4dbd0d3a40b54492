"""DDP training whose nodes share their caches: ``loader.DataLoader(partition_cache=True)``.

    torchrun --nproc-per-node 2 examples/partitioned_ddp.py --data DIR --cache-bytes 200M
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB \\
        examples/partitioned_ddp.py --data DIR --cache-bytes 200M

``DIR`` is in the ImageNet layout. Each rank trains a small CNN (DDP, gloo on the CPU) on its share of the
epoch (``DistributedSampler``) and prints, per epoch, where its records came from: its node's cache, other
nodes' caches, or storage. ``--node-dirs`` gives every rank its own cache folder under ``--cache-dir``, so
ranks on one machine act as separate nodes (a test, or a trial of the setup before it goes to a cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import loader
from stallbench.conditions.sizes import parse_size


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="image folder, DIR/<class>/<file>.jpg")
    parser.add_argument("--cache-bytes", type=parse_size, required=True, help="each node's cache, e.g. 200M")
    parser.add_argument("--cache-dir", default="/dev/shm")
    parser.add_argument("--node-dirs", action="store_true", help="a cache folder per rank (one node each)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait on a node before storage"
    )
    return parser.parse_args(argv)


def small_cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 5, stride=4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(128, classes),
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cache_dir = Path(args.cache_dir) / f"stallbench-node{rank}" if args.node_dirs else Path(args.cache_dir)
    cache_dir.mkdir(mode=0o700, exist_ok=True)
    dataset = loader.ImageFolder(args.data, transform=loader.TrainTransform(size=64))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    train = loader.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        cache_bytes=args.cache_bytes,
        cache_dir=cache_dir,
        partition_cache=loader.Partition(timeout=args.timeout),  # the one new option: caches shared
    )
    model = DistributedDataParallel(small_cnn(len(dataset.classes)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        before, start = train.stats(), time.perf_counter()
        for images, labels in train:
            loss = nn.functional.cross_entropy(model(images.float() / 255), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        after = train.stats()
        moved = {k: getattr(after, k) - getattr(before, k) for k in ("bytes_from_cache", "bytes_from_peers")}
        moved["bytes_from_source"] = after.bytes_from_source - before.bytes_from_source
        line = {"rank": rank, "epoch": epoch + 1, "seconds": round(time.perf_counter() - start, 3), **moved}
        sys.stdout.write(json.dumps(line) + "\n")  # one write: ranks share stdout (print may write twice)
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
