"""A saved loader state restored in a new process, as a restarted job is: the same batches follow, and with
workers the same random draws (a transform's augmentation), compared whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_jpeg_folder

pytestmark = pytest.mark.multiproc
JOB = Path(__file__).with_name("_resume_job.py")
BATCHES = 14  # 40 records in batches of 3
WORKERS = [(2, 0), (2, 1)]  # (workers, persistent)


def run_job(*args: object) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(JOB.parent), str(JOB.parent.parent)])}
    subprocess.run([sys.executable, str(JOB), *map(str, args)], check=True, env=env, timeout=120)


def saved_and_restored(tmp_path: Path, workers: int, persistent: int, saved_at: int, *kind: str) -> tuple:
    """What the saved job went on to get after ``saved_at`` batches of its second epoch, and what a new
    process restoring its state gets."""
    state, saved, restored = tmp_path / "state.pt", tmp_path / "saved.json", tmp_path / "restored.json"
    run_job("save", state, saved, workers, persistent, saved_at, *kind)
    more = 2 if saved_at < BATCHES else 1  # after the last batch, the first iterator is the next epoch
    run_job("load", state, restored, workers, persistent, more, *kind)
    return json.loads(saved.read_text()), json.loads(restored.read_text())


@pytest.mark.parametrize(("workers", "persistent"), [(0, 0), *WORKERS])
@pytest.mark.parametrize("saved_at", [5, BATCHES], ids=["mid-epoch", "after-last-batch"])
def test_restored_state_gives_what_the_saved_job_went_on_to_get(workers, persistent, saved_at, tmp_path):
    went_on, again = saved_and_restored(tmp_path, workers, persistent, saved_at)
    assert len(went_on) == 2 * BATCHES + BATCHES - saved_at
    assert again == went_on


@pytest.mark.parametrize(("workers", "persistent"), WORKERS)
@pytest.mark.parametrize("saved_at", [0, 5, BATCHES], ids=["before-first-batch", "mid-epoch", "after-last"])
def test_restored_workers_draw_what_the_saved_ones_went_on_to_draw(workers, persistent, saved_at, tmp_path):
    """Each sample draws from torch, random and numpy in its worker: the draws after the restart are the
    ones the saved job made, as are the records (saved at 5, the deal resumes at worker 1 of 2)."""
    went_on, again = saved_and_restored(tmp_path, workers, persistent, saved_at, "drawn")
    assert len(went_on) == 2 * BATCHES + BATCHES - saved_at
    assert again == went_on
    draws = [sample[1:] for batch in went_on for sample in batch]
    assert len({tuple(d) for d in draws}) == len(draws)  # every sample drew anew: nothing replayed


@pytest.mark.parametrize(("workers", "persistent"), WORKERS)
def test_a_restored_train_transform_crops_and_flips_as_the_saved_one(workers, persistent, tmp_path):
    """Our ``"train"`` transform (random resized crop and flip) on JPEGs, mid-epoch: every tensor the same."""
    data = make_jpeg_folder(tmp_path / "images", per_class=20, classes=2)
    went_on, again = saved_and_restored(tmp_path, workers, persistent, 5, "train", data)
    assert len(went_on) == 2 * BATCHES + BATCHES - 5
    assert again == went_on


def test_a_loader_with_live_workers_restores_in_place():
    """``load_state_dict`` on a loader whose persistent workers run: they start again as the saved ones."""
    from _resume_job import make, record

    dl = make(2, True, "drawn", None)
    list(dl)
    it = iter(dl)
    for _ in range(5):
        next(it)
    state = dl.state_dict()
    went_on = [record(b, "drawn") for b in it]
    dl.load_state_dict(state)
    assert [record(b, "drawn") for b in dl] == went_on
    assert len(went_on) == BATCHES - 5
