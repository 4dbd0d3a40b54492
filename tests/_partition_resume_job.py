"""The ranks of a partitioned-cache job restarting from a saved state: one new process, as a job restarts,
that forks each rank of its world (gloo on loopback; each rank a node, with a cache folder of its own).

``_partition_resume_job.py STATE_IN STATE_OUT OUT WORLD TAKE WORKERS CACHES``: each rank's loader (epoch 1 of
a DistributedSampler, seed 3, ``partition_cache=True``) restores STATE_IN ("-": none) and takes TAKE batches
(-1: the rest of the epoch, then the next one); rank 0's ``state_dict()`` goes to STATE_OUT, as a job saves
it, and each rank's samples and the change of its stats over each epoch to OUT as JSON. Every rank ends the
epoch before any leaves, as DDP's ranks do; a record waited for past the exchange's timeout, or a peer gone,
is an error (the warning raised), not a read from storage.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import sys
import warnings
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from helpers import MemorySource, first_index
from torch.utils.data import DistributedSampler

from loader import DataLoader, Partition, SourceDataset

RECORDS, BATCH, SIZE = 240, 4, 64
COUNTS = ("peer_hits", "hits", "misses")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def epoch(dl: DataLoader, batches: Iterable[Any], before: Any = None) -> dict:
    """The samples of ``batches`` and what the epoch changed in the loader's counts since ``before`` (the
    loader's stats; None: taken now)."""
    before = dl.stats() if before is None else before
    samples = [i for batch in batches for i in batch[0].tolist()]
    after = dl.stats()
    delta = {key: getattr(after, key) - getattr(before, key) for key in COUNTS}
    delta["records_received"] = after.partition["records_received"] - before.partition["records_received"]
    return {"samples": samples, "stats": delta}


def run_rank(args: list[str], world: int, me: int, port: int, results: Connection) -> None:
    state_in, state_out, caches = args[0], args[1], args[6]
    take, workers = int(args[4]), int(args[5])
    warnings.filterwarnings("error", message="partition_cache", category=RuntimeWarning)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=me, world_size=world)
    dataset = SourceDataset(MemorySource(RECORDS, size=SIZE), transform=first_index)
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    sampler.set_epoch(1)
    cache_dir = Path(caches) / f"node{me}"
    cache_dir.mkdir(mode=0o700, exist_ok=True)
    dl = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=workers,
        cache_bytes=1 << 20,
        cache_dir=cache_dir,
        partition_cache=Partition(timeout=20.0),
    )
    if state_in != "-":
        dl.load_state_dict(torch.load(state_in, weights_only=False))
    before = dl.stats()  # before iter(): it starts the exchange, which may receive every record ahead at once
    it = iter(dl)
    record = {"resumed": epoch(dl, it if take < 0 else (next(it) for _ in range(take)), before)}
    if me == 0:
        torch.save(dl.state_dict(), state_out)
    del it  # its workers stop
    if take < 0:
        sampler.set_epoch(2)
        record["next"] = epoch(dl, dl)
    dist.barrier()  # no rank leaves while another still takes its node's records
    results.send(record)
    os._exit(0)  # the exchange may be mid-message to a rank that stopped mid-epoch: nothing waits for it


def main(args: list[str]) -> None:
    world, out = int(args[3]), args[2]
    forked = multiprocessing.get_context("fork")
    port, pipes, ranks = free_port(), [], []
    for me in range(world):
        receive, send = forked.Pipe(duplex=False)
        ranks.append(forked.Process(target=run_rank, args=(args, world, me, port, send)))
        pipes.append((receive, send))
    try:
        for process in ranks:
            process.start()
        for _, send in pipes:
            send.close()  # a rank that dies unsent then ends its pipe: recv raises EOFError
        records = [receive.recv() for receive, _ in pipes]
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
            process.join()
    Path(out).write_text(json.dumps(records))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1:])
