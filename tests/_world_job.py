"""A rank of a job over torch's DistributedSampler that restarts from a saved state, as its own process.

``_world_job.py STATE_IN STATE_OUT OUT WORLD RANK TAKE WORKERS``: the loader of rank RANK of WORLD (epoch 1 of
a DistributedSampler, seed 3) restores STATE_IN ("-": none), takes TAKE batches (-1: the rest of the
epoch, then the next epoch beside torch's loader's for it), saves ``state_dict()`` to STATE_OUT ("-": not
saved) and writes the samples of each batch taken (and the next epoch's, ours and torch's) to OUT as JSON.
"""

from __future__ import annotations

import json
import sys

import torch
from helpers import MemorySource, first_index
from torch.utils.data import DistributedSampler

from loader import DataLoader, SourceDataset

RECORDS, BATCH = 50, 3


def main(state_in: str, state_out: str, out: str, world: str, rank: str, take: str, workers: str) -> None:
    dataset = SourceDataset(MemorySource(RECORDS), transform=first_index)
    sampler = DistributedSampler(dataset, num_replicas=int(world), rank=int(rank), shuffle=True, seed=3)
    sampler.set_epoch(1)
    dl = DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=int(workers))
    if state_in != "-":
        dl.load_state_dict(torch.load(state_in, weights_only=False))
    it = iter(dl)
    taken = [batch[0].tolist() for batch in (it if int(take) < 0 else (next(it) for _ in range(int(take))))]
    if state_out != "-":
        torch.save(dl.state_dict(), state_out)
    record = {"taken": taken}
    if int(take) < 0:
        sampler.set_epoch(2)
        record["next"] = [batch[0].tolist() for batch in dl]
        record["torch_next"] = [
            batch[0].tolist()
            for batch in torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
        ]
    with open(out, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
