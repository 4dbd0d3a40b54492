"""A packed training job that saves its place, or restarts from it: run as its own process, as users restart.

``save DATA STATE OUT KIND WORKERS ALGORITHM AT`` runs epoch 0, then epoch 1 up to step AT (or its
``end``), saves the sampler's state (and, for KIND ``ours``, the loader's) to STATE, and records in OUT what
it goes on to get: the rest of epoch 1 and epoch 2. ``load ... AT`` restores STATE in a new process and
records the same. KIND: ``sampler`` (the packs themselves), ``torch`` (torch's DataLoader) or ``ours``
(loader.DataLoader); each step is recorded as its packed ``input_ids``. ``batch MODE CASES`` runs many cases
in one process (``_job_batch``).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from typing import Any

import torch
from _job_batch import job_main

import loader
from loader.packing import PackedBatchSampler, PackingCollator

MAX_LEN = 64


def make(data: str, kind: str, workers: int, algorithm: str) -> tuple[PackedBatchSampler, Any]:
    dataset = loader.ArrowDataset(data)
    sampler = PackedBatchSampler(dataset.source.token_lengths(), MAX_LEN, algorithm=algorithm, seed=5)
    if kind == "sampler":
        return sampler, sampler
    loader_class = loader.DataLoader if kind == "ours" else torch.utils.data.DataLoader
    collate = PackingCollator(MAX_LEN, block_mask=False)
    return sampler, loader_class(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers)


def steps(it: Iterator[Any]) -> list[list[int]]:
    return [step if isinstance(step, list) else step["input_ids"][0].tolist() for step in it]


def main(
    mode: str, data: str, state_file: str, out_file: str, kind: str, workers: str, algorithm: str, *at: str
):
    sampler, source = make(data, kind, int(workers), algorithm)
    if mode == "save":
        list(source)  # a whole epoch first: the saved state is not the start
        it = iter(source)
        taken = sum(1 for _ in itertools.islice(it, None if at[0] == "end" else int(at[0])))
        state = {"sampler": sampler.state_dict(consumed=None if kind == "ours" else taken)}
        if kind == "ours":
            state["loader"] = source.state_dict()
        torch.save(state, state_file)
        rest = steps(it) + steps(iter(source))
    else:
        state = torch.load(state_file)
        sampler.load_state_dict(state["sampler"])
        if kind == "ours":
            source.load_state_dict(state["loader"])
        rest = steps(iter(source))
        if at[0] != "end":  # that was the rest of the saved epoch; the next follows
            rest += steps(iter(source))
    with open(out_file, "w") as f:
        json.dump(rest, f)


if __name__ == "__main__":
    job_main(main, sys.argv[1:])
