"""One rank of bench_partition.py: an emulated node reading raw JPEG records, partitioned cache or not.

``_partition_job.py CONFIG.json`` under torchrun: each rank has its own cache folder (its own node) and a
cache of ``cache_bytes``; ``partition`` turns the partitioned cache on. Before each epoch rank 0 drops the
dataset's pages from the page cache (as for a dataset far larger than memory), then every rank times its
epoch and counts the bytes its processes read from the storage device (the kernel's count). One JSON line
per epoch and rank.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DistributedSampler

import loader
from loader.system.counters import storage_read_bytes
from stallbench.conditions.storage import evict_page_cache, files_in


def main(config: dict) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cache_dir = Path(config["cache_root"]) / f"node{rank}"
    cache_dir.mkdir(mode=0o700, exist_ok=True)
    dataset = loader.ImageFolder(config["data"], transform=None)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    dl = loader.DataLoader(
        dataset, batch_size=32, sampler=sampler, num_workers=2, persistent_workers=True,
        cache_bytes=config["cache_bytes"], cache_dir=cache_dir, partition_cache=config["partition"],
    )  # fmt: skip
    files = list(files_in(config["data"]))
    for epoch in range(config["epochs"]):
        sampler.set_epoch(epoch)
        if rank == 0:
            evict_page_cache(files)
        dist.barrier()
        start, read = time.perf_counter(), storage_read_bytes()
        records = sum(len(raw) for raw, _ in dl)
        seconds, read = time.perf_counter() - start, storage_read_bytes() - read
        stats = dl.stats()
        line = {"rank": rank, "epoch": epoch, "seconds": seconds, "storage_bytes": read, "records": records,
                "peers_bytes": stats.bytes_from_peers, "cache_bytes": stats.bytes_from_cache,
                "storage_share": stats.partition["storage_share"] if stats.partition else 0.0}  # fmt: skip
        sys.stdout.write(json.dumps(line) + "\n")  # one write: ranks share stdout (print may write twice)
        sys.stdout.flush()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
