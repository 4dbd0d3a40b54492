"""Samplers that never end or list millions of indices: the first batch at once, memory independent of the
sampler's length, and resume exact (the position is kept, not the order), against torch's class."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from _endless_job import Endless, Squares

from loader import DataLoader

JOB = Path(__file__).with_name("_endless_job.py")
LOADERS = [torch.utils.data.DataLoader, DataLoader]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_endless_sampler_gives_torch_s_batches_at_once(workers):
    taken = {}
    for cls in LOADERS:
        dl = cls(Squares(), sampler=Endless(3), batch_size=5, num_workers=workers)
        taken[cls] = [batch.tolist() for batch in itertools.islice(dl, 20)]
    assert taken[DataLoader] == taken[torch.utils.data.DataLoader]
    assert len(taken[DataLoader]) == 20


class Many(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2_000_000

    def __getitem__(self, i: int) -> int:
        return i


def first_batch_cost(cls: type) -> tuple[float, int]:
    """Seconds and the peak of Python's allocations until the first batch of a 2M-index epoch."""
    tracemalloc.start()
    start = time.perf_counter()
    next(iter(cls(Many(), batch_size=4)))
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak


def test_a_long_sampler_costs_what_it_costs_with_torch_s_class():
    (_, torch_peak), (_, our_peak) = (first_batch_cost(cls) for cls in LOADERS)
    assert our_peak < torch_peak + (1 << 20)  # listing 500,000 batches of 4 took ~60 MB here


@pytest.mark.multiproc
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("at", [0, 7])
def test_an_endless_sampler_resumes_exactly_in_a_new_process(tmp_path, workers, at):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(JOB.parent), str(JOB.parent.parent)])}
    state, saved, restored = tmp_path / "state.pt", tmp_path / "saved.json", tmp_path / "restored.json"
    for args in (("save", state, saved, workers, at), ("load", state, restored, workers)):
        subprocess.run([sys.executable, str(JOB), *map(str, args)], check=True, env=env, timeout=120)
    went_on, again = json.loads(saved.read_text()), json.loads(restored.read_text())
    assert len(again) == 12 and again == went_on
