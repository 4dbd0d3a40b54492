"""The partitioned cache's parts in one process: who owns what, the chunks of each rank's order, the inbox,
the refusals. (Several ranks on loopback: test_partition_jobs.py; each rank's order of an epoch, fresh or
restored: test_dataloader_resume.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.utils.data import DistributedSampler

import loader
from loader.partition.inbox import Inbox
from loader.partition.plan import CHUNK, Layout, chunks_for
from loader.partition.split import Split, SplitChooser, split_share
from tests.helpers import MemorySource, first_index, make_jpeg_folder


def test_ranks_at_one_place_are_one_node_and_records_are_dealt_round_robin():
    layout = Layout.from_places([("a", "/c"), ("a", "/c"), ("b", "/c"), ("a", "/d")], rank=1)
    assert layout.node_of == (0, 0, 1, 2) and layout.nodes == 3 and layout.node == 0
    assert [layout.owner(i) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert layout.leader(0) == 0 and not layout.leads and Layout.from_places(["x", "y"], 1).leads
    assert [layout.local(i) for i in range(4)] == [True, False, False, True]


def test_a_server_sends_a_rank_the_records_its_node_owns_in_steps_of_its_order():
    layout = Layout.from_places(["a", "b"], rank=0)
    order = list(range(CHUNK * 2 + 3))
    chunks = chunks_for(order, layout, server_node=1, split=Split())
    assert [len(c) for c in chunks] == [CHUNK // 2, CHUNK // 2, 1]
    assert [i for c in chunks for i in c] == [i for i in order if i % 2 == 1]


def test_a_split_leaves_out_the_records_the_rank_reads_from_storage_alike_on_both_sides():
    layout = Layout.from_places(["a", "b"], rank=0)
    order = list(range(10_000))
    split = Split(epoch=3, share=0.3)
    sent = {i for c in chunks_for(order, layout, server_node=1, split=split) for i in c}
    remote = {i for i in order if i % 2 == 1}
    from_storage = {i for i in remote if split.from_storage(i)}
    assert sent == remote - from_storage  # the sender leaves out exactly what the workers read themselves
    assert len(from_storage) / len(remote) == pytest.approx(0.3, abs=0.02)
    again = {i for i in remote if Split(epoch=4, share=0.3).from_storage(i)}
    assert again != from_storage  # another epoch, other records
    assert not any(Split(epoch=3, share=0.0).from_storage(i) for i in remote)


def test_the_split_reads_storage_only_where_it_is_about_as_fast_as_the_peers():
    def chooser(storage: float, peers: float, split_epoch: float) -> list[Split]:
        """Epoch 0 reads ``storage`` MB in 1 s; epoch 1 receives ``peers`` MB in 1 s; the others take
        ``split_epoch`` s each."""
        c, clock, splits = SplitChooser(), 0.0, []
        ended = [(0, 0, 0.0), (storage, 0, 1.0), (0, peers, 1.0), (0, 0, split_epoch), (0, 0, split_epoch)]
        for read, received, seconds in ended:  # what the epoch that ended before each call did
            clock += seconds
            splits.append(c.next_epoch(read * 1e6, received * 1e6, clock))
        return splits

    # storage as fast as the peers: half from each from the third epoch on, while that is faster
    assert chooser(100, 100, split_epoch=0.7) == [Split(0, 0.0), Split(1, 0.0)] + [
        Split(e, pytest.approx(0.5)) for e in (2, 3, 4)
    ]
    # storage at 1.5 times the peers' rate: 60% from storage, so that both paths end together
    assert chooser(150, 100, split_epoch=0.7)[2] == Split(2, pytest.approx(0.6))
    # storage at half the peers' rate is not worth its reads
    assert {s.share for s in chooser(50, 100, split_epoch=0.7)} == {0.0}
    # a split measured slower than the peers alone (1.2 s against 1 s, past the noise) is dropped
    assert [s.share for s in chooser(100, 100, split_epoch=1.2)] == [0.0, 0.0, pytest.approx(0.5), 0.0, 0.0]


def test_the_split_rule_is_one_function_of_the_two_rates():
    # the rule the chooser above applies and stallbench's nodes what-if predicts with
    assert split_share(100e6, 100e6) == pytest.approx(0.5)
    assert split_share(150e6, 100e6) == pytest.approx(0.6)
    assert split_share(80e6, 100e6) == pytest.approx(80 / 180)  # at SPLIT_WHEN: shared
    assert split_share(79e6, 100e6) == 0.0  # below it: the peers are clearly faster


def test_the_inbox_publishes_the_split_for_the_workers(tmp_path):
    inbox = Inbox.make(tmp_path, rank=0)
    assert inbox.split((0, Split())) == (0, Split())  # none published: every record from the peers
    inbox.set_split(Split(2, 0.25))
    known = inbox.split((0, Split()))
    assert known[1] == Split(2, 0.25)
    assert inbox.split(known) is known  # the same file: not read again
    inbox.set_split(Split(3, 0.5))
    assert inbox.split(known)[1] == Split(3, 0.5)
    inbox.remove()


def test_the_inbox_hands_each_record_to_one_taker_whole(tmp_path):
    inbox = Inbox.make(tmp_path, rank=0)
    inbox.put(7, b"seven")
    inbox.put(7, memoryview(b"seven"))  # a batch that holds record 7 twice gets it twice
    assert inbox.waiting() == 2
    assert inbox.take(7, owner=1, timeout=1) == b"seven" and inbox.take(7, owner=1, timeout=1) == b"seven"
    assert inbox.waiting() == 0
    inbox.put(8, b"eight")
    inbox.clear()
    assert inbox.waiting() == 0
    inbox.remove()
    assert not inbox.path.exists()


def test_the_inbox_refuses_a_damaged_record(tmp_path):
    inbox = Inbox.make(tmp_path, rank=0)
    inbox.put(3, b"three")
    path = inbox.path / "p-3-0"
    path.write_bytes(path.read_bytes()[:-1] + b"E")
    assert inbox.take(3, owner=1, timeout=5) is None


def test_the_inbox_stops_waiting_when_the_owner_is_gone_or_at_the_timeout(tmp_path):
    inbox = Inbox.make(tmp_path, rank=0)
    start = time.monotonic()
    assert inbox.take(1, owner=1, timeout=0.2) is None
    assert 0.2 <= time.monotonic() - start < 5
    inbox.mark_gone(1)
    start = time.monotonic()
    assert inbox.take(1, owner=1, timeout=60) is None and time.monotonic() - start < 5


KILLED_RANK = """
import os, signal, sys
from pathlib import Path
from loader.partition.inbox import Inbox
inbox = Inbox.make(Path(sys.argv[1]), rank=1)
for i in range(42):
    inbox.put(i, bytes(30_000))
print(inbox.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as a node is killed: nothing runs after
"""


@pytest.mark.multiproc
def test_the_next_rank_to_start_removes_the_inbox_a_killed_rank_left(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_RANK, str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert killed.returncode == -signal.SIGKILL
    left = Path(killed.stdout.strip())
    assert len(list(left.glob("p-*"))) == 42  # 1.3 MB, as a killed node left it
    live = Inbox.make(tmp_path, rank=0)
    assert not left.exists() and list(tmp_path.iterdir()) == [live.path]
    again = Inbox.make(tmp_path, rank=1)  # a live rank's inbox is left alone
    assert live.path.exists() and again.path.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [(dict(timeout=0), "timeout"), (dict(timeout=True), "timeout"), (dict(ahead=0), "ahead")],
)
def test_bad_partition_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        loader.Partition(**options)


def test_partition_cache_outside_torch_distributed_says_what_it_needs(tmp_path, shm_dir):
    dataset = loader.ImageFolder(str(make_jpeg_folder(tmp_path / "images")), transform=None)
    with pytest.raises(ValueError, match="torchrun"):
        loader.DataLoader(dataset, cache_bytes=1 << 20, cache_dir=shm_dir, partition_cache=True)
    with pytest.raises(ValueError, match="partition_cache must be"):
        loader.DataLoader(dataset, cache_bytes=1 << 20, cache_dir=shm_dir, partition_cache="yes")
    with pytest.raises(ValueError, match="source-backed"):
        loader.DataLoader(list(range(4)), partition_cache=True)


@pytest.fixture
def one_rank():
    """torch.distributed with this process as its only rank (gloo on loopback)."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_under_torch_distributed_it_needs_a_distributed_sampler_and_a_cache(tmp_path, shm_dir, one_rank):
    dataset = loader.ImageFolder(str(make_jpeg_folder(tmp_path / "images")), transform=None)
    with pytest.raises(ValueError, match="DistributedSampler"):
        loader.DataLoader(dataset, cache_bytes=1 << 20, cache_dir=shm_dir, partition_cache=True)
    with pytest.raises(ValueError, match="cache_bytes"):
        loader.DataLoader(dataset, sampler=DistributedSampler(dataset), partition_cache=True)


def test_a_cache_that_cannot_be_made_is_named_as_such_not_as_a_missing_cache_bytes(
    tmp_path, shm_dir, one_rank
):
    dataset = loader.ImageFolder(str(make_jpeg_folder(tmp_path / "images")), transform=None)
    own = shm_dir / f"stallbench-{os.geteuid()}"
    own.mkdir(mode=0o700)
    own.chmod(0o777)  # our own folder, opened to others: refused
    with (
        pytest.warns(UserWarning, match="cannot be made"),
        pytest.raises(
            ValueError, match=rf"none could be made in cache_dir='{shm_dir}' with cache_bytes=1048576"
        ),
    ):
        loader.DataLoader(
            dataset, sampler=DistributedSampler(dataset), cache_bytes=1 << 20, cache_dir=shm_dir,
            partition_cache=True,
        )  # fmt: skip


def test_one_node_alone_reads_through_its_cache_as_without_partitioning(tmp_path, shm_dir, one_rank):
    root = make_jpeg_folder(tmp_path / "images")
    dataset = loader.ImageFolder(str(root), transform=None)
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    dl = loader.DataLoader(dataset, batch_size=2, sampler=sampler, cache_bytes=1 << 20, cache_dir=shm_dir,
                           partition_cache=True)  # fmt: skip
    files = sorted(p.read_bytes() for p in root.rglob("*.jpg"))
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert sorted(r for raw, _ in dl for r in raw) == files
    stats = dl.stats()
    assert stats.hits == len(files) and stats.bytes_from_peers == 0 and stats.partition["nodes"] == 1


def test_an_epochs_exchange_starts_only_once_its_workers_are_forked(tmp_path, shm_dir, one_rank, monkeypatch):
    """A worker forked while the exchange's threads run can inherit a lock one of them holds and hang for good
    (seen in CI): the last epoch's exchange ends before the workers fork, the next one starts after."""
    from torch.utils.data import dataloader as torch_dataloader

    from loader.partition.wiring import PartitionedCache

    events = []
    real_init = torch_dataloader._MultiProcessingDataLoaderIter.__init__
    real_end, real_start = PartitionedCache.end_epoch, PartitionedCache.start_epoch

    def forking(self, *args, **kwargs):
        events.append("fork")
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(torch_dataloader._MultiProcessingDataLoaderIter, "__init__", forking)
    monkeypatch.setattr(PartitionedCache, "end_epoch", lambda s, *a: events.append("end") or real_end(s, *a))
    monkeypatch.setattr(
        PartitionedCache, "start_epoch", lambda s, sm: events.append("start") or real_start(s, sm)
    )
    dataset = loader.ImageFolder(str(make_jpeg_folder(tmp_path / "images")), transform=None)
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    dl = loader.DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=1, cache_bytes=1 << 20,
                           cache_dir=shm_dir, partition_cache=True)  # fmt: skip
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert len([r for raw, _ in dl for r in raw]) == len(dataset)
    assert events == ["end", "fork", "start"] * 2


def test_a_restored_epoch_under_another_epoch_is_refused_before_the_exchange_plans_it(shm_dir, one_rank):
    """A state saved by 2 ranks, restored on this one under epoch 2: refused naming both, as without
    partition_cache, by ``iter()`` (every rank's order is worked out before the exchange starts); the state
    stays restored, so after ``set_epoch(1)`` the rest of the saved epoch follows."""
    dataset = loader.SourceDataset(MemorySource(40), transform=first_index)
    saving = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=3)
    saving.set_epoch(1)
    saved = loader.DataLoader(dataset, batch_size=3, sampler=saving)
    batches = iter(saved)
    handed_out = [i for _ in range(4) for i in next(batches)[0].tolist()]
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    sampler.set_epoch(2)
    dl = loader.DataLoader(
        dataset, batch_size=3, sampler=sampler, cache_bytes=1 << 20, cache_dir=shm_dir, partition_cache=True
    )
    dl.load_state_dict(saved.state_dict())
    with pytest.raises(ValueError, match=r"epoch 1, seed 3, 40 records.*epoch 2.*set_epoch\(1\)"):
        iter(dl)
    sampler.set_epoch(1)
    order, reached = list(sampler), 2 * 4 * 3  # this one rank's order is the whole epoch's
    assert [i for batch in dl for i in batch[0].tolist()] == order[reached:]
    assert set(handed_out) <= set(order[:reached])
