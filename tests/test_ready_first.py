"""``DataLoader(ready_first=True)``: batches of the samples ready first; every sample once an epoch."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, SequentialSampler, default_collate

import loader

N = 200
BATCH = 16
HELD_FOR_S = 60.0  # a held sample gives up waiting after this: a failing test ends, never hangs


class Numbers(Dataset):
    """Sample ``i`` is ``{"x": tensor of i's, "i": i}``; sample ``held`` waits for ``gate`` to exist."""

    def __init__(self, n: int = N, held: int | None = None, gate: Path | None = None, bad: int | None = None):
        self.n, self.held, self.gate, self.bad = n, held, gate, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if i == self.bad:
            raise ValueError(f"sample {i} is bad")
        if i == self.held and self.gate is not None:
            deadline = time.monotonic() + HELD_FOR_S
            while not self.gate.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return {"x": torch.full((3, 4), float(i)), "i": i}


def indices(batches: list[dict]) -> list[int]:
    return [int(i) for b in batches for i in b["i"]]


def whole_epoch(dl: loader.DataLoader) -> list[dict]:
    batches = list(dl)
    for b in batches:  # each sample's tensor is its own, collated with its index
        assert torch.equal(b["x"], b["i"].to(torch.float32).view(-1, 1, 1).expand(-1, 3, 4))
    return batches


@pytest.mark.multiproc
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("persistent", [False, True])
def test_every_sample_comes_once_an_epoch_in_full_batches_as_torch_s_loader_gives(drop_last, persistent):
    torch_dl = torch.utils.data.DataLoader(Numbers(), batch_size=BATCH, shuffle=True, drop_last=drop_last)
    ours = loader.DataLoader(Numbers(), batch_size=BATCH, shuffle=True, drop_last=drop_last, num_workers=2,
                             persistent_workers=persistent, ready_first=True)  # fmt: skip
    for _ in range(2):
        expected = list(torch_dl)
        got = whole_epoch(ours)
        assert len(got) == len(expected) == len(ours)
        assert [len(b["i"]) for b in got] == [len(b["i"]) for b in expected]  # 12 x 16, then 8 (or not)
        if drop_last:  # the sampler's last partial batch is dropped: which samples differ by the draw
            assert len(set(indices(got))) == len(indices(got)) == N // BATCH * BATCH
        else:
            assert sorted(indices(got)) == list(range(N))


@pytest.mark.multiproc
def test_a_slow_sample_holds_no_batch_and_comes_in_a_later_one(tmp_path):
    """Sample 0 is held until the gate opens: torch's first batch would wait for it; with ready_first the
    loop gets batch after batch without it, and it comes once it is ready."""
    gate = tmp_path / "gate"
    dl = loader.DataLoader(Numbers(held=0, gate=gate), batch_size=BATCH, num_workers=2, ready_first=True)
    it = iter(dl)
    try:
        early = [next(it) for _ in range(4)]
        assert 0 not in indices(early)
    finally:
        gate.touch()
    rest = list(it)
    assert 0 in indices(rest)
    assert sorted(indices(early + rest)) == list(range(N))


@pytest.mark.multiproc
def test_the_loaders_collate_fn_makes_each_batch_from_the_samples_themselves():
    seen: list[int] = []

    def count(samples: list[dict]) -> int:
        seen.append(len(samples))
        assert all(type(s["x"]) is torch.Tensor and s["x"].shape == (3, 4) for s in samples)
        return len(samples)

    dl = loader.DataLoader(Numbers(), batch_size=BATCH, num_workers=2, collate_fn=count, ready_first=True)
    sizes = [BATCH] * (N // BATCH) + [N % BATCH]
    assert list(dl) == sizes
    assert seen == sizes  # in the main process, once a batch: the workers hand on samples


@pytest.mark.multiproc
def test_a_bad_sample_raises_its_own_error_in_the_loop_as_with_torch():
    dl = loader.DataLoader(Numbers(bad=37), batch_size=BATCH, num_workers=2, ready_first=True)
    with pytest.raises(ValueError, match="sample 37 is bad"):
        list(dl)


class Endless(IterableDataset):
    def __iter__(self):
        yield from range(10)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"num_workers": 0}, "needs workers"),
        ({"batch_size": None}, "needs batch_size"),
        (
            {"batch_size": 1, "batch_sampler": BatchSampler(SequentialSampler(range(N)), 4, False)},
            "batch_size",
        ),
        ({"coordinate": True}, "coordinate= or partition_cache="),
        ({"ready_first": "yes"}, "ready_first must be True or False"),
        ({"ready_first": 1}, "ready_first must be True or False"),
    ],
)
def test_where_no_batch_of_samples_can_be_made_the_error_says_why(options, said):
    kwargs = {"batch_size": BATCH, "num_workers": 2, "ready_first": True, **options}
    if "batch_sampler" in options:
        kwargs.pop("batch_size")
    with pytest.raises(ValueError, match=said):
        loader.DataLoader(Numbers(), **kwargs)


def test_an_iterable_dataset_makes_its_own_batches():
    with pytest.raises(ValueError, match="map-style"):
        loader.DataLoader(Endless(), batch_size=2, num_workers=2, ready_first=True)


@pytest.mark.multiproc
def test_state_dict_mid_epoch_says_an_epoch_s_rest_is_no_count_of_batches():
    dl = loader.DataLoader(Numbers(), batch_size=BATCH, num_workers=2, ready_first=True)
    it = iter(dl)
    next(it)
    with pytest.raises(ValueError, match="exact between epochs only"):
        dl.state_dict()


RESUMED = """
import json, sys, torch
sys.path.insert(0, {tests!r})
import loader
from test_ready_first import BATCH, Numbers, indices
dl = loader.DataLoader(Numbers(), batch_size=BATCH, shuffle=True, drop_last=True, num_workers=2,
                       ready_first=True, generator=torch.Generator().manual_seed(5))
if {state!r}:
    dl.load_state_dict(torch.load({state!r}))
else:
    list(dl)
    torch.save(dl.state_dict(), {path!r})
print(json.dumps([sorted(indices(list(dl))) for _ in range(2)]))
"""


@pytest.mark.multiproc
def test_a_job_restarted_between_epochs_gets_the_epochs_it_would_have(tmp_path):
    """drop_last: which samples an epoch leaves out is the epoch's draw; a new process restored from the
    state saved after epoch 1 draws epochs 2 and 3 as the first process does."""
    path = str(tmp_path / "state.pt")

    def run(state: str) -> list[list[int]]:
        script = RESUMED.format(tests=os.path.dirname(__file__), state=state, path=path)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    first = run("")
    assert run(path) == first
    assert first[0] != first[1] and all(len(epoch) == N // BATCH * BATCH for epoch in first)


@pytest.mark.multiproc
def test_a_stopped_worker_delays_only_its_pieces_and_loses_nothing():
    dl = loader.DataLoader(
        Numbers(), batch_size=BATCH, num_workers=2, persistent_workers=True, ready_first=True
    )
    list(dl)
    it = iter(dl)
    worker = it._workers[0].pid
    os.kill(worker, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (worker, signal.SIGCONT)).start()
    assert sorted(indices(list(it))) == list(range(N))


@pytest.mark.multiproc
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_worker_ends_the_epoch_with_torch_s_error_and_leaves_nothing_in_dev_shm(tmp_path, signum):
    gate = tmp_path / "gate"  # never opened: the worker that takes sample 0 stays inside it until killed
    dl = loader.DataLoader(Numbers(held=0, gate=gate), batch_size=BATCH, num_workers=2, ready_first=True)
    it = iter(dl)
    pids = [w.pid for w in it._workers]
    try:
        next(it)
        os.kill(pids[0], signum)
        with pytest.raises(RuntimeError, match="DataLoader worker"):
            for _ in it:
                pass
    finally:
        gate.touch()
        it._shutdown_workers()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    left = [name for name in os.listdir("/dev/shm") if name.startswith(tuple(f"torch_{p}_" for p in pids))]
    assert not left


Point = collections.namedtuple("Point", ["x", "y"])


class Mixed(Dataset):
    """Each kind ``default_collate`` makes: tensors (small and past the pieces' by-value size), numbers,
    strings, a namedtuple, a tuple of fields, an empty list (first: no rows to count by), in a defaultdict
    (kept as one)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return collections.defaultdict(
            int,
            {
                "empty": [],
                "i": i,
                "small": torch.full((2,), i),
                "large": torch.full((64, 64), float(i)),
                "name": f"sample-{i}",
                "point": Point(i, float(i) / 2),
                "pair": (i, str(i)),
            },
        )


def same(a, b) -> bool:
    """Whole values equal: tensors by dtype, shape and every element; containers by type and content."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.multiproc
@pytest.mark.parametrize("batch_size", [BATCH, 30])  # pieces of 4, or of 8 8 8 6: some batches join a cut
@pytest.mark.parametrize("context", [None, "spawn"])  # pieces in the batch ring, or (spawned) by value
def test_each_batch_is_default_collate_of_its_samples(batch_size, context):
    ds = Mixed()
    dl = loader.DataLoader(ds, batch_size=batch_size, num_workers=2, shuffle=True, ready_first=True,
                           multiprocessing_context=context)  # fmt: skip
    batches = list(dl)
    for batch in batches:
        assert same(batch, default_collate([ds[int(i)] for i in batch["i"]]))
    assert sorted(int(i) for b in batches for i in b["i"]) == list(range(N))


@pytest.mark.multiproc
def test_an_epoch_left_early_leaves_nothing_in_the_next(tmp_path):
    """A ``break`` with a slow sample's piece still being made, persistent workers: with one index queue a
    worker may take every worker's restart while another makes the old piece; the next epoch gets every
    sample once and none of the old."""
    gate = tmp_path / "gate"
    dl = loader.DataLoader(Numbers(64, held=30, gate=gate), batch_size=8, num_workers=2,
                           persistent_workers=True, ready_first=True)  # fmt: skip
    it = iter(dl)
    next(it)
    time.sleep(0.5)  # a worker is inside sample 30 (piece 15 of the 16 dealt), the other idle
    threading.Timer(0.5, gate.touch).start()  # the old piece comes after the restart
    try:
        assert sorted(indices(list(dl))) == list(range(64))
    finally:
        gate.touch()


@pytest.mark.multiproc
def test_a_piece_of_only_skipped_records_is_dropped_and_the_batches_stay_full():
    from helpers import MemorySource, first_index

    source = MemorySource(40)
    for i in range(8, 12):
        source.records[i] = None
    dl = loader.DataLoader(loader.SourceDataset(source, transform=first_index), batch_size=4, num_workers=2,
                           on_error="skip", ready_first=True)  # fmt: skip
    batches = list(dl)
    got = sorted(int(i) for b in batches for i in b[0])
    assert got == [i for i in range(40) if not 8 <= i < 12]
    assert [len(b[0]) for b in batches] == [4] * 9 and dl.stats().records_skipped == 4
