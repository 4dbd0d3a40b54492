"""One rank of a partitioned-cache job, as a DDP script runs it: ``python _partition_job.py CONFIG.json``.

Started by torchrun (or with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set). Each rank reads an image
folder as raw bytes through ``loader.DataLoader(partition_cache=...)`` with its own cache folder (its own
"node"), and prints ``batch <epoch> <k>`` per batch (tests time kills by it). Its results go to
``rank<R>.jsonl`` beside the config, one JSON line per epoch (the SHA-256 of every record it got, in order,
and the change of its stats over the epoch), then one for its cache: a file of its own, since ranks share
torchrun's stdout and a line past the pipe's atomic write size would interleave with another rank's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DistributedSampler

import loader

COUNTS = ("bytes_from_cache", "bytes_from_peers", "bytes_from_source", "hits", "peer_hits", "misses")


def main(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = (config_path.parent / f"rank{rank}.jsonl").open("w")
    dataset = loader.ImageFolder(config["data"], transform=None)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    cache_dir = Path(config["cache_root"]) / f"node{rank}"
    cache_dir.mkdir(mode=0o700, exist_ok=True)
    dl = loader.DataLoader(
        dataset,
        batch_size=config.get("batch", 8),
        sampler=sampler,
        num_workers=config.get("workers", 1),
        cache_bytes=config["cache_bytes"],
        cache_dir=cache_dir,
        partition_cache=loader.Partition(timeout=config.get("timeout", 20.0)),
    )
    before = dl.stats()
    for epoch in range(config["epochs"]):
        sampler.set_epoch(epoch)
        digests = []
        for k, (raw, _) in enumerate(dl):
            print(f"batch {epoch} {k}", flush=True)
            digests += [hashlib.sha256(r).hexdigest() for r in raw]
            time.sleep(config.get("step", 0.0))
        after = dl.stats()
        delta = {key: getattr(after, key) - getattr(before, key) for key in COUNTS}
        delta.update({f"partition_{k}": v for k, v in after.partition.items()})
        out.write(json.dumps({"rank": rank, "epoch": epoch, "digests": digests, "stats": delta}) + "\n")
        out.flush()
        before = after
    info = dataclasses.asdict(dl.cache.info())
    out.write(json.dumps({"rank": rank, "cache": {k: v for k, v in info.items() if k != "path"}}) + "\n")
    out.close()
    if config.get("end") == "return":  # as many scripts end: no barrier, no destroy_process_group
        return
    if config.get("end") == "exit":  # a node was killed: no barrier with it, and no goodbye
        sys.stdout.flush()
        os._exit(0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))
