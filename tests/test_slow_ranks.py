"""Slow ranks under torchrun: the rank whose data comes late is the one named as holding the others, and
what the others wait at each step's collective for it agrees with the script's own hand timing of its
all-reduces, on a quiet machine and with a process burning each core."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stallbench.analysis.collectives import RankWaits, rank_waits
from stallbench.jobs.spec import JobSpec, read_records
from tests.test_bootstrap import REPO, _env
from tests.test_transitions import burning, near

SCRIPT = REPO / "examples" / "slow_rank.py"
EPOCHS = 3


def _torchrun(tmp_path: Path, slow_rank: int) -> tuple[dict[int, RankWaits], dict[int, dict]]:
    """The script on 2 ranks under the bootstrap: the slow-rank figures of its last epoch, and the script's
    own hand timing of that epoch per rank."""
    out = tmp_path / "out"
    env = _env(JobSpec(out_dir=str(out)).write(tmp_path / "spec.json"))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd = [
        *torchrun,
        str(SCRIPT),
        "--epochs",
        str(EPOCHS),
        "--slow-rank",
        str(slow_rank),
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    last = [r for r in read_records(out) if r.loader == "0:Prepared" and r.epoch == EPOCHS and r.complete]
    assert sorted(r.rank for r in last) == [0, 1]
    files = [tmp_path / f"witness-{rank}.jsonl" for rank in (0, 1)]
    lines = [json.loads(line) for file in files for line in file.read_text().splitlines()]
    witness = {line["rank"]: line for line in lines if line["epoch"] == EPOCHS}
    return rank_waits({r.rank: r.timeline for r in last}), witness


@pytest.mark.multiproc
@pytest.mark.parametrize(("slow", "busy"), [(1, False), (0, False), (1, True)], ids=["1", "0", "1-busy"])
def test_the_rank_whose_data_comes_late_holds_the_others_as_long_as_they_timed(tmp_path, slow, busy):
    with burning(busy):
        waits, witness = _torchrun(tmp_path, slow)
    other = 1 - slow
    held = witness[other]["collective"] - witness[slow]["collective"]  # beyond the all-reduce's own time
    assert held > 0.2, witness  # 16 batches, each ~22 ms later on the slow rank
    assert near(waits[other].waits_for_others_seconds, held), (waits, witness)
    assert near(waits[slow].holds_others_seconds, held), (waits, witness)
    assert (
        waits[slow].waits_for_others_seconds < 0.1 * held and waits[other].holds_others_seconds < 0.1 * held
    )


def test_ranks_that_share_no_collective_hold_no_one():
    late, early = [(0.030, 0.002)] * 10, [(0.002, 0.002)] * 10  # equal steps: nobody waited in them
    waits = rank_waits({0: early, 1: late})
    assert waits == {0: RankWaits(0.0, 0.0), 1: RankWaits(0.0, 0.0)}


def test_each_step_s_late_rank_is_charged_with_what_the_others_waited_for_it():
    timelines = {  # step 0: rank 2 is late by 30 and 20 ms; step 1: rank 0 late by 10 ms on both
        0: [(0.010, 0.035), (0.020, 0.005)],
        1: [(0.020, 0.025), (0.010, 0.015)],
        2: [(0.040, 0.005), (0.010, 0.015)],
    }
    waits = rank_waits(timelines)
    assert waits[0].waits_for_others_seconds == pytest.approx(0.030)
    assert waits[1].waits_for_others_seconds == pytest.approx(0.020 + 0.010)
    assert waits[2].waits_for_others_seconds == pytest.approx(0.010)
    assert waits[2].holds_others_seconds == pytest.approx((0.030 + 0.020) / 2)
    assert waits[0].holds_others_seconds == pytest.approx((0.010 + 0.010) / 2)
    assert waits[1].holds_others_seconds == 0.0
    assert rank_waits({0: timelines[0]}) == {}
