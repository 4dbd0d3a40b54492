"""A saved loader state restored in a new process, as a restarted job is: the same batches follow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc
JOB = Path(__file__).with_name("_resume_job.py")
BATCHES = 14  # 40 records in batches of 3


def run_job(*args: object) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(JOB.parent), str(JOB.parent.parent)])}
    subprocess.run([sys.executable, str(JOB), *map(str, args)], check=True, env=env, timeout=120)


@pytest.mark.parametrize(("workers", "persistent"), [(0, 0), (2, 0), (2, 1)])
@pytest.mark.parametrize("saved_at", [5, BATCHES], ids=["mid-epoch", "after-last-batch"])
def test_restored_state_gives_what_the_saved_job_went_on_to_get(workers, persistent, saved_at, tmp_path):
    state, saved, restored = tmp_path / "state.pt", tmp_path / "saved.json", tmp_path / "restored.json"
    run_job("save", state, saved, workers, persistent, saved_at)
    more = 2 if saved_at < BATCHES else 1  # after the last batch, the first iterator is the next epoch
    run_job("load", state, restored, workers, persistent, more)
    went_on, again = json.loads(saved.read_text()), json.loads(restored.read_text())
    assert len(went_on) == 2 * BATCHES + BATCHES - saved_at
    assert again == went_on
