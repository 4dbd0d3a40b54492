"""The ranks of a job over torch's DistributedSampler restarting from a saved state: one new process, as a
job restarts, that runs each rank's loader in turn.

``_world_job.py STATE_IN STATE_OUT OUT WORLD TAKE WORKERS``: the loader of each rank of WORLD (epoch 1 of a
DistributedSampler, seed 3) restores STATE_IN ("-": none), takes TAKE batches (-1: the rest of the epoch,
then the next epoch beside torch's loader's for it); rank 0's ``state_dict()`` is saved to STATE_OUT, as a
job saves it, and each rank's batches (and next epochs, ours and torch's) are written to OUT as JSON.
"""

from __future__ import annotations

import json
import sys

import torch
from helpers import MemorySource, first_index
from torch.utils.data import DistributedSampler

from loader import DataLoader, SourceDataset

RECORDS, BATCH = 50, 3


def rank(state_in: str, world: int, rank: int, take: int, workers: int) -> tuple[dict, dict]:
    dataset = SourceDataset(MemorySource(RECORDS), transform=first_index)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=3)
    sampler.set_epoch(1)
    dl = DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=workers)
    if state_in != "-":
        dl.load_state_dict(torch.load(state_in, weights_only=False))
    it = iter(dl)
    record = {"taken": [batch[0].tolist() for batch in (it if take < 0 else (next(it) for _ in range(take)))]}
    state = dl.state_dict()
    if take < 0:
        sampler.set_epoch(2)
        record["next"] = [batch[0].tolist() for batch in dl]
        theirs = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
        record["torch_next"] = [batch[0].tolist() for batch in theirs]
    return record, state


def main(state_in: str, state_out: str, out: str, world: str, take: str, workers: str) -> None:
    runs = [rank(state_in, int(world), r, int(take), int(workers)) for r in range(int(world))]
    torch.save(runs[0][1], state_out)
    with open(out, "w") as f:
        json.dump([record for record, _ in runs], f)


if __name__ == "__main__":
    main(*sys.argv[1:])
