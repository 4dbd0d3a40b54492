"""Each sample's prep timed where it is made (``stallbench.jobs._sample_times``): the slow ones written down,
named by index and file, and read back by the epoch they fell in."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.utils.data import Subset

from stallbench.analysis.training import slow_again
from stallbench.jobs._sample_times import path_of, slowest
from stallbench.jobs.spec import LoaderEpoch


class Listed:
    """A Dataset that lists its files as an ``ImageFolder`` does: ``samples`` of (path, class)."""

    def __init__(self) -> None:
        self.samples = [(f"/data/{i}.jpg", i % 2) for i in range(10)]


def test_a_sample_is_named_by_the_file_its_dataset_lists():
    assert path_of(Listed(), 3) == "/data/3.jpg"
    assert path_of(Subset(Listed(), [7, 2]), 1) == "/data/2.jpg"  # through a Subset, to its own index
    paths = type("Paths", (), {"paths": [Path("/x/a.png"), Path("/x/b.png")]})()
    assert path_of(paths, 1) == "/x/b.png"
    assert path_of(object(), 0) is None and path_of(Listed(), 99) is None


def test_the_epoch_reads_its_own_dataset_s_slow_samples_within_its_span(tmp_path):
    lines = [
        {"dataset": 1, "index": 5, "seconds": 0.02, "at": 10.0, "path": "/d/5"},
        {"dataset": 1, "index": 9, "seconds": 0.05, "at": 11.0, "path": None},
        {"dataset": 2, "index": 3, "seconds": 0.09, "at": 10.5, "path": None},  # another loader's Dataset
        {"dataset": 1, "index": 4, "seconds": 0.08, "at": 20.0, "path": None},  # after the epoch
    ]
    (tmp_path / "samples-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"datas')
    assert slowest(str(tmp_path), 1, 9.0, 12.0) == {
        "slow_sample_count": 2,
        "slow_samples": [[9, 0.05, None], [5, 0.02, "/d/5"]],
        "slow_times": [[9, 0.05], [5, 0.02]],  # the slowest first
    }


def _epoch(times: dict[int, float]) -> LoaderEpoch:
    slow = [[index, seconds] for index, seconds in times.items()]
    return LoaderEpoch("0:D", 0, 1, 1, 1.0, 0.5, 0.5, 0.1, 4, 32, 0, 1.0, True, "torch", slow_times=slow)


def test_slow_again_is_the_share_of_an_epoch_s_slow_sample_time_taken_by_samples_slow_the_epoch_before():
    data = {100: 0.025, 200: 0.025, 300: 0.025}
    assert slow_again([_epoch(data), _epoch({**data, 400: 0.025})]) == pytest.approx(0.75)  # the data's own
    assert slow_again([_epoch({1: 0.01, 2: 0.01}), _epoch({3: 0.01, 4: 0.01})]) == 0.0  # chance
    # a busy machine: 30 preempted samples a few ms over the mark beside the 3 slow ones every epoch
    busy = {**data, **{1000 + i: 0.003 for i in range(30)}}
    assert slow_again([_epoch(data), _epoch(busy)]) == pytest.approx(0.075 / 0.165)
    assert slow_again([_epoch({100: 0.02})]) == 0.0 and slow_again([_epoch({1: 0.02}), _epoch({})]) == 0.0


TIMED = """
import sys, time, torch
sys.path.insert(0, {repo!r})
from stallbench.jobs import _sample_times
import torch.utils.data._utils.fetch as fetch
_sample_times.time_samples(fetch, {out!r})

class Slow(torch.utils.data.Dataset):
    paths = ["/data/%d.jpg" % i for i in range(64)]
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.03 if i in (3, 40) else 0.001)
        return i

dl = torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers={workers})
print(sum(len(b) for b in dl))
"""


def test_a_worker_writes_down_the_sample_that_took_many_times_its_mean(tmp_path):
    repo = str(Path(__file__).resolve().parents[1])
    for workers in (0, 2):
        out = tmp_path / f"out-{workers}"
        out.mkdir()
        start = time.monotonic()
        script = TIMED.format(repo=repo, out=str(out), workers=workers)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.split() == ["64"], done.stderr[-2000:]
        made = list(out.glob("samples-*.jsonl"))  # the processes that made them: workers, or the main
        written = [json.loads(line) for f in made for line in f.read_text().splitlines()]
        # sample 3 among a fresh process's first, judged once its mean is known; 40 at once
        assert sorted((w["index"], w["path"]) for w in written) == [(3, "/data/3.jpg"), (40, "/data/40.jpg")]
        assert all(w["seconds"] >= 0.03 and start <= w["at"] <= time.monotonic() for w in written)
