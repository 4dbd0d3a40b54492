"""A saved loader state restored in a new process, as a restarted job is: the same batches follow, and with
workers the same random draws (a transform's augmentation), compared whole. Every case's loader is saved in
one new process and restored in another (``_job_batch``), not two processes a case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _job_batch import OUT, STATE, Restarts
from helpers import MemorySource, first_index, make_jpeg_folder

pytestmark = pytest.mark.multiproc
JOB = Path(__file__).with_name("_resume_job.py")
BATCHES = 14  # 40 records in batches of 3
WORKERS = [(2, 0), (2, 1)]  # (workers, persistent)
SAVED_AT = {"index": [5, BATCHES], "drawn": [0, 5, BATCHES], "train": [5]}  # each kind's cases, per workers
KIND_WORKERS = {"index": [(0, 0), *WORKERS], "drawn": WORKERS, "train": WORKERS}


def case(workers: int, persistent: int, saved_at: int, kind: str) -> str:
    return f"{kind}-{workers}-{persistent}-at-{saved_at}"


@pytest.fixture(scope="module")
def restarts(tmp_path_factory) -> Restarts:
    """Every case below, each with a loader of its own: saved by one new process, restored by another."""
    restarts = Restarts(JOB, tmp_path_factory.mktemp("resume"), timeout=120)
    for kind, saved_ats in SAVED_AT.items():
        for workers, persistent in KIND_WORKERS[kind]:
            for saved_at in saved_ats:
                add_case(restarts, workers, persistent, saved_at, kind)
    return restarts


def add_case(restarts: Restarts, workers: int, persistent: int, saved_at: int, kind: str) -> None:
    name = case(workers, persistent, saved_at, kind)
    data = []  # the JPEGs a "train" case reads: a folder of its own, as each test had
    if kind == "train":
        data.append(make_jpeg_folder(restarts.folder(name) / "images", per_class=20, classes=2))
    more = 2 if saved_at < BATCHES else 1  # after the last batch, the first iterator is the next epoch
    restarts.add(
        name,
        save=[STATE, OUT, workers, persistent, saved_at, kind, *data],
        load=[STATE, OUT, workers, persistent, more, kind, *data],
    )


def saved_and_restored(restarts: Restarts, workers: int, persistent: int, saved_at: int, kind: str) -> tuple:
    """What the saved job went on to get after ``saved_at`` batches of its second epoch, and what a new
    process restoring its state gets."""
    return restarts.outcome(case(workers, persistent, saved_at, kind))


@pytest.mark.parametrize(("workers", "persistent"), KIND_WORKERS["index"])
@pytest.mark.parametrize("saved_at", SAVED_AT["index"], ids=["mid-epoch", "after-last-batch"])
def test_restored_state_gives_what_the_saved_job_went_on_to_get(workers, persistent, saved_at, restarts):
    went_on, again = saved_and_restored(restarts, workers, persistent, saved_at, "index")
    assert len(went_on) == 2 * BATCHES + BATCHES - saved_at
    assert again == went_on


@pytest.mark.parametrize(("workers", "persistent"), KIND_WORKERS["drawn"])
@pytest.mark.parametrize("saved_at", SAVED_AT["drawn"], ids=["before-first-batch", "mid-epoch", "after-last"])
def test_restored_workers_draw_what_the_saved_ones_went_on_to_draw(workers, persistent, saved_at, restarts):
    """Each sample draws from torch, random and numpy in its worker: the draws after the restart are the
    ones the saved job made, as are the records (saved at 5, the deal resumes at worker 1 of 2)."""
    went_on, again = saved_and_restored(restarts, workers, persistent, saved_at, "drawn")
    assert len(went_on) == 2 * BATCHES + BATCHES - saved_at
    assert again == went_on
    draws = [sample[1:] for batch in went_on for sample in batch]
    assert len({tuple(d) for d in draws}) == len(draws)  # every sample drew anew: nothing replayed


@pytest.mark.parametrize(("workers", "persistent"), KIND_WORKERS["train"])
def test_a_restored_train_transform_crops_and_flips_as_the_saved_one(workers, persistent, restarts):
    """Our ``"train"`` transform (random resized crop and flip) on JPEGs, mid-epoch: every tensor the same."""
    went_on, again = saved_and_restored(restarts, workers, persistent, 5, "train")
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


def test_each_restart_with_other_workers_gives_the_samples_not_yet_seen_once(tmp_path):
    """What the peers' users ask for (issue 46): a job saved with 2 workers, restarted with 4, saved and
    restarted again without workers, each a new process: the batches are the ones the saved job went on to
    get, so every sample of the epoch comes once."""
    state, outs = tmp_path / "state.pt", [tmp_path / f"{mode}.json" for mode in ("save", "relay", "load")]
    steps = [("save", 2, 5), ("relay", 4, 4), ("load", 0, 0)]  # (mode, workers, batches: at / taken / epochs)
    for (mode, workers, count), out in zip(steps, outs, strict=True):
        argv = [sys.executable, str(JOB), mode, str(state), str(out), str(workers), "0", str(count)]
        done = subprocess.run(argv, cwd=JOB.parent, text=True, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    went_on, relayed, rest = (json.loads(out.read_text()) for out in outs)
    assert relayed + rest == went_on[: BATCHES - 5] and len(relayed) == 4
    samples = [i for batch in relayed + rest for i in batch]
    assert len(samples) == len(set(samples)) == 40 - 5 * 3  # the 5 batches of 3 seen before the first save


def test_each_restart_with_another_world_size_gives_the_samples_not_yet_seen_once(tmp_path):
    """A job over torch's DistributedSampler saved with 2 ranks after 4 batches each, restarted with 3 ranks
    that take 2 batches (with workers), saved, restarted with 4 that take the rest: each restart a new
    process, from rank 0's state (DDP's ranks step together). Each part of the epoch is the next stretch of
    the one order the sampler dealt, every sample once; the next epoch is torch's."""
    from _world_job import BATCH, RECORDS
    from torch.utils.data import DistributedSampler

    from loader import SourceDataset

    job = JOB.with_name("_world_job.py")
    phases = [(2, 4, 0), (3, 2, 2), (4, -1, 0)]  # (world size, batches taken: -1 the rest, workers)
    taken, state_in = [], "-"
    for phase, (world, take, workers) in enumerate(phases):
        state_out, out = tmp_path / f"state-{phase}.pt", tmp_path / f"out-{phase}.json"
        argv = [str(a) for a in (job, state_in, state_out, out, world, take, workers)]
        done = subprocess.run(
            [sys.executable, *argv], cwd=JOB.parent, text=True, capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs = json.loads(out.read_text())
        assert len(runs) == world
        taken.append([i for run in runs for batch in run["taken"] for i in batch])
        state_in = state_out
    whole = DistributedSampler(SourceDataset(MemorySource(RECORDS)), num_replicas=1, rank=0, seed=3)
    whole.set_epoch(1)
    order = list(whole)
    first, second = 2 * 4 * BATCH, 3 * 2 * BATCH
    assert sorted(taken[0]) == sorted(order[:first])
    assert sorted(taken[1]) == sorted(order[first : first + second])
    assert sorted(taken[2]) == sorted(order[first + second :])
    assert sorted(i for part in taken for i in part) == list(range(RECORDS))
    assert all(run["next"] == run["torch_next"] for run in runs) and runs[0]["next"]


def _rank_loader(world: int, rank: int, batch_size: int | None, shuffle: bool, drop_last: bool, epoch=1):
    from torch.utils.data import DistributedSampler

    from loader import DataLoader, SourceDataset

    dataset = SourceDataset(MemorySource(50), transform=first_index)
    sampler = DistributedSampler(dataset, world, rank, shuffle=shuffle, seed=3, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last)


def _samples(item, batched: bool) -> list[int]:
    return item[0].tolist() if batched else [int(item[0])]


@pytest.mark.parametrize(
    "batch_size, shuffle, drop_last", [(2, True, True), (3, False, False), (None, True, False)]
)
def test_world_size_changes_deal_the_rest_of_the_one_order(batch_size, shuffle, drop_last):
    """2 ranks, then 3, then 3 again (an epoch already dealt again, dealt once more), then 4 that take the
    rest: each stretch is the next part of the sampler's one order; the last is the rest, dealt as the
    sampler deals (padded to even shares by repeating its start, or cut where ``drop_last``)."""
    per = batch_size or 1
    phases = [(2, 2), (3, 2), (3, 1), (4, None)]  # (world size, items each rank takes: None the rest)
    state, taken, reached = None, [], 0
    for world, take in phases:
        part, states = [], []
        for rank in range(world):
            dl = _rank_loader(world, rank, batch_size, shuffle, drop_last)
            if state is not None:
                dl.load_state_dict(state)
            it = iter(dl)
            got = list(it) if take is None else [next(it) for _ in range(take)]
            part += [i for item in got for i in _samples(item, batch_size is not None)]
            states.append(dl.state_dict())
        state = states[0]  # rank 0's, as a job saves it
        taken.append(part)
    order = list(_rank_loader(1, 0, None, shuffle, False).sampler)
    for (world, take), part in zip(phases[:-1], taken, strict=False):
        assert sorted(part) == sorted(order[reached : reached + world * take * per])
        reached += world * take * per
    last, rest = taken[-1], order[reached:]
    assert last and (set(last) <= set(rest) if drop_last else set(last) == set(rest))
    assert len(last) - len(set(last)) < 4  # the padding: at most one short of a share per rank
    before = [i for part in taken[:-1] for i in part]
    assert len(before) == len(set(before)) and not set(before) & set(last)


def test_a_state_saved_before_the_first_batch_after_a_restore_keeps_its_place():
    """Without workers an iterator made after ``load_state_dict`` draws nothing before its first batch: a
    state saved then is the restored one, not the epoch's start."""
    dl = _rank_loader(2, 0, 3, True, False)
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    went_on = [b[0].tolist() for b in it]
    restored = _rank_loader(2, 0, 3, True, False)
    restored.load_state_dict(state)
    iter(restored)  # made, no batch taken
    again = _rank_loader(2, 0, 3, True, False)
    again.load_state_dict(restored.state_dict())
    assert [b[0].tolist() for b in again] == went_on and len(went_on) == 9 - 3


def test_a_world_size_change_under_another_epoch_is_refused_naming_it():
    dl = _rank_loader(2, 0, 3, True, False)
    next(iter(dl))
    state = dl.state_dict()
    other = _rank_loader(3, 0, 3, True, False, epoch=2)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match=r"epoch 1, seed 3, 50 records.*epoch 2.*set_epoch\(1\)"):
        next(iter(other))


def test_every_rank_works_out_each_ranks_order_of_a_fresh_epoch_as_that_rank_draws_it():
    from torch.utils.data import DistributedSampler

    from loader.resume.world_change import order_of

    dataset = list(range(50))
    mine = DistributedSampler(dataset, num_replicas=3, rank=0, shuffle=True, seed=7)
    mine.set_epoch(4)
    for rank in range(3):
        theirs = DistributedSampler(dataset, num_replicas=3, rank=rank, shuffle=True, seed=7)
        theirs.set_epoch(4)
        assert order_of(mine, rank) == list(theirs)
    assert mine.rank == 0  # its own sampler is left as it was


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_works_out_each_ranks_order_of_a_restored_epoch_as_that_rank_walks_it(world):
    """What a partitioned cache plans its exchange from: a state saved by 2 ranks after 4 batches each,
    restored on each of ``world`` ranks (the rest of each rank's own order, or the rest dealt again)."""
    from loader.resume.world_change import resumed_orders

    saved = _rank_loader(2, 0, 3, True, False)
    batches = iter(saved)
    for _ in range(4):
        next(batches)
    state = saved.state_dict()
    planner = _rank_loader(world, 0, 3, True, False)  # any rank works out every rank's alike
    saved_dealing, start = state["draw_states"]["distributed"], state["batches_delivered"]
    orders = resumed_orders(planner.batch_sampler, planner.sampler, saved_dealing, start)
    for rank in range(world):
        restored = _rank_loader(world, rank, 3, True, False)
        restored.load_state_dict(state)
        assert orders(rank) == [i for batch in restored for i in batch[0].tolist()]
