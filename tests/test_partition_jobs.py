"""The partitioned cache across processes on loopback, each with its own cache folder as a node has: ranks of
one torchrun, two torchrun agents (``--nnodes 2``), a node killed mid-epoch, and a job saved mid-epoch and
restarted on as many nodes and on others."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from torch.utils.data import DistributedSampler

import loader
import tests._partition_resume_job as resume_job
from loader.cache._layout import index_bytes
from loader.partition.split import Split
from tests.helpers import make_jpeg_folder

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

JOB = Path(__file__).with_name("_partition_job.py")
REPO = JOB.parent.parent
RECORDS = 200
PIPES = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, list[bytes]]:
    root = make_jpeg_folder(tmp_path_factory.mktemp("data") / "images", per_class=RECORDS // 2, classes=2)
    source = loader.ImageFolder(str(root), transform=None).source
    return root, [source.read(i) for i in range(len(source))]


def config_file(tmp_path: Path, **config) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def results(folder: Path) -> tuple[dict[tuple[int, int], dict], dict[int, dict]]:
    """What each rank of ``_partition_job.py`` wrote to its own ``rank<R>.jsonl`` in ``folder``."""
    texts = [path.read_text() for path in folder.glob("rank*.jsonl")]
    lines = [json.loads(line) for text in texts for line in text.splitlines()]
    epochs = {(r["rank"], r["epoch"]): r for r in lines if "epoch" in r}
    return epochs, {r["rank"]: r["cache"] for r in lines if "cache" in r}


def expected(records: list[bytes], world: int, rank: int, epoch: int) -> list[str]:
    sampler = DistributedSampler(records, num_replicas=world, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return [hashlib.sha256(records[i]).hexdigest() for i in sampler]


def test_two_nodes_cache_twice_as_much_and_send_each_other_their_records(tmp_path, data, shm_dir):
    root, records = data
    dataset_bytes = sum(map(len, records))
    share = dataset_bytes // 4  # each node caches a quarter: the two hold half the dataset
    # a step per batch, as a training job has, sets each epoch's pace: epoch 1's storage then delivers this
    # node's records and the other's in about the time epoch 2's peers deliver the other's alone, so the
    # rates differ by ~2x rather than by the machine's noise (without it, epoch 1's start-up alone decided)
    cfg = config_file(tmp_path, data=str(root), cache_root=str(shm_dir), epochs=3, workers=1, step=0.05,
                      cache_bytes=index_bytes(RECORDS) + share)  # fmt: skip
    argv = torchrun("--nproc-per-node", "2", "--master-port", str(free_port()), str(JOB), str(cfg))
    done = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    epochs, caches = results(tmp_path)
    split_bytes = {}  # the other node's records each rank read from storage instead, as its split said
    for (rank, epoch), r in epochs.items():
        assert r["digests"] == expected(records, 2, rank, epoch)  # every record whole, in the rank's order
        split = Split(epoch, r["stats"]["partition_storage_share"])
        theirs = [i for i in sampler_order(records, rank, epoch) if i % 2 != rank]
        split_bytes[rank, epoch] = sum(len(records[i]) for i in theirs if split.from_storage(i))
        assert (
            r["stats"]["bytes_from_peers"] == sum(len(records[i]) for i in theirs) - split_bytes[rank, epoch]
        )
    # the first two epochs take every record from the peers; the third splits: storage here (4 KB records,
    # unthrottled) delivers at least SPLIT_WHEN of the peers' rate
    assert [epochs[0, e]["stats"]["partition_storage_share"] > 0 for e in range(3)] == [False, False, True]
    for rank in (0, 1):
        received = [epochs[rank, e]["stats"]["partition_bytes_received"] for e in range(3)]
        assert received[-1] == sum(epochs[rank, e]["stats"]["bytes_from_peers"] for e in range(3))
    floor = max(0, dataset_bytes - 2 * share)
    for epoch in (1, 2):  # what no cache holds, once; and what a split read from storage that a cache held
        storage = sum(storage_bytes(epochs, rank, epoch) for rank in (0, 1))
        split = sum(split_bytes[rank, epoch] for rank in (0, 1))
        assert floor - 0.02 * dataset_bytes <= storage <= floor + split + 0.02 * dataset_bytes, (
            storage,
            floor,
        )
    assert all(c["full"] for c in caches.values())
    assert not [p for p in shm_dir.rglob("peers-*")]  # each rank's inbox goes with it


def sampler_order(records: list[bytes], rank: int, epoch: int) -> list[int]:
    sampler = DistributedSampler(records, num_replicas=2, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return list(sampler)


def storage_bytes(epochs: dict, rank: int, epoch: int) -> int:
    """What rank read from storage in ``epoch``: for its own batches, and to send to the other node."""
    stats = epochs[rank, epoch]["stats"]
    served = (
        stats["partition_bytes_read_to_serve"]
        - epochs[rank, epoch - 1]["stats"]["partition_bytes_read_to_serve"]
    )
    return stats["bytes_from_source"] + served


def test_two_torchrun_agents_rendezvous_on_localhost_as_two_nodes(tmp_path, data, shm_dir):
    root, records = data
    cfg = config_file(tmp_path, data=str(root), cache_root=str(shm_dir), epochs=2, workers=1,
                      cache_bytes=index_bytes(RECORDS) + sum(map(len, records)))  # fmt: skip
    rdzv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "partition-test"]  # fmt: skip
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    argv = torchrun(*rdzv, str(JOB), str(cfg))
    agents = [subprocess.Popen(argv, env=env(), cwd=tmp_path, **pipes) for _ in range(2)]
    outs = [agent.communicate(timeout=300) for agent in agents]
    assert all(agent.returncode == 0 for agent in agents), [err[-2000:] for _, err in outs]
    epochs, _ = results(tmp_path)
    assert set(epochs) == {(r, e) for r in (0, 1) for e in (0, 1)}
    for (rank, epoch), r in epochs.items():
        assert r["digests"] == expected(records, 2, rank, epoch)
        assert r["stats"]["bytes_from_peers"] > 0 and r["stats"]["partition_nodes"] == 2
    assert epochs[0, 1]["stats"]["bytes_from_source"] == epochs[1, 1]["stats"]["bytes_from_source"] == 0


def test_a_node_killed_mid_epoch_the_others_finish_from_storage_within_the_timeout(tmp_path, data, shm_dir):
    root, records = data
    whole = index_bytes(RECORDS) + sum(map(len, records))
    cfg = config_file(tmp_path, data=str(root), cache_root=str(shm_dir), epochs=2, workers=1, timeout=5,
                      step=0.05, cache_bytes=whole, end="exit")  # fmt: skip
    port = free_port()
    ranks = []
    for rank in range(3):
        rank_env = {**env(), "RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": "0",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        ranks.append(subprocess.Popen([sys.executable, str(JOB), str(cfg)], env=rank_env, cwd=tmp_path,
                                      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    victim = ranks[2]
    while victim.stdout.readline().strip() != "batch 0 1":
        pass
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    start = time.monotonic()
    outs = [proc.communicate(timeout=120) for proc in ranks[:2]]
    assert all(proc.returncode == 0 for proc in ranks[:2]), [err[-2000:] for _, err in outs]
    assert time.monotonic() - start < 60
    epochs, _ = results(tmp_path)
    for rank in (0, 1):  # the second epoch needs the dead node's records: they come from storage
        for epoch in (0, 1):
            assert epochs[rank, epoch]["digests"] == expected(records, 3, rank, epoch)  # none lost or damaged
    assert any("read from storage" in err for _, err in outs)


def finish_all(runs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """Each run's (stdout, stderr); a run still going after ``timeout`` seconds is killed with every
    process it started, and its output so far kept for the failure's message."""
    deadline, outs = time.monotonic() + timeout, []
    for run in runs:
        try:
            outs.append(run.communicate(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            kill_tree(run.pid)
            outs.append(run.communicate(timeout=30))
    return outs


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants: torchrun starts each rank in a session of its own, so killing
    the agent's session would leave the ranks (and the pipes they hold) behind."""
    agent = psutil.Process(pid)
    for proc in [*agent.children(recursive=True), agent]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def doc_commands() -> list[str]:
    doc = (REPO / "docs" / "how-to" / "multi-node.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", doc, flags=re.S)
    return [line for block in blocks for line in block.splitlines()]


@pytest.mark.parametrize("which", [0, 1])
def test_the_multi_node_how_to_commands_train_with_shared_caches(tmp_path, data, shm_dir, which):
    root, _ = data
    command = doc_commands()[which].replace("DIR", str(root)).replace("200M", "300K")
    command = (
        command.replace("HOST:29400", f"127.0.0.1:{free_port()}")
        .replace("my-job", tmp_path.name)
        .removeprefix("torchrun ")
    )

    def start(cache_dir: Path, *port: str) -> subprocess.Popen:
        argv = torchrun(*port, *shlex.split(command), "--cache-dir", str(cache_dir), "--epochs", "2")
        return subprocess.Popen(argv, env=env(), cwd=REPO, start_new_session=True, **PIPES)

    if which == 0:  # one machine, a cache folder per rank
        runs = [start(shm_dir, "--master-port", str(free_port()))]
    else:  # two agents, as two machines run it, each with its own cache folder
        folders = [shm_dir / "a", shm_dir / "b"]
        for folder in folders:
            folder.mkdir(mode=0o700)
        runs = [start(folder) for folder in folders]
    outs = finish_all(runs, timeout=150)
    assert all(run.returncode == 0 for run in runs), [err[-3000:] for _, err in outs]
    lines = [json.loads(line) for out, _ in outs for line in out.splitlines() if line.startswith("{")]
    assert sorted((r["rank"], r["epoch"]) for r in lines) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert all(r["bytes_from_peers"] > 0 for r in lines)
    assert sum(r["bytes_from_cache"] for r in lines if r["epoch"] == 2) > 0


RESUME_JOB = JOB.with_name("_partition_resume_job.py")


def restart(folder: Path, name: str, state_in: str, world: int, take: int, workers: int) -> list[dict]:
    """One phase of a job saved and restarted (``_partition_resume_job.py``): a new process that runs its
    ``world`` ranks, the nodes' caches in ``folder``/caches; its state goes to ``folder``/``name``.pt, and
    each rank's record comes back. The process and its ranks are killed whatever happens."""
    out, state_out = folder / f"{name}.json", folder / f"{name}.pt"
    argv = [str(a) for a in (RESUME_JOB, state_in, state_out, out, world, take, workers, folder / "caches")]
    run = subprocess.Popen(
        [sys.executable, *argv], env=env(), cwd=RESUME_JOB.parent, start_new_session=True, **PIPES
    )
    try:
        ((_, err),) = finish_all([run], timeout=90)
    finally:
        if run.poll() is None:
            kill_tree(run.pid)
    assert run.returncode == 0, err[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def saved_mid_epoch(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Epoch 1 of a partitioned job on 2 nodes (a worker each), saved after 12 batches of each rank: the
    folder of its state (``saved.pt``) and caches, and each rank's record."""
    folder = tmp_path_factory.mktemp("partition-resume")
    (folder / "caches").mkdir(mode=0o700)
    return folder, restart(folder, "saved", "-", world=2, take=12, workers=1)


def torch_order(world: int, rank: int, epoch: int) -> list[int]:
    """Rank ``rank``'s samples of ``epoch`` as torch's sampler deals them (the job's seed and dataset)."""
    sampler = DistributedSampler(
        range(resume_job.RECORDS), num_replicas=world, rank=rank, shuffle=True, seed=3
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def samples(records: list[dict]) -> list[int]:
    """What the ranks of a phase took of the epoch it resumed (or began)."""
    return [i for record in records for i in record["resumed"]["samples"]]


def assert_other_nodes_sent_theirs(records: list[dict], epoch: str) -> None:
    """Each rank (a node of its own) took every record of ``epoch`` that another node owns from that node,
    none from storage (a wait past the exchange's timeout is an error in the job)."""
    for rank, record in enumerate(records):
        theirs = [i for i in record[epoch]["samples"] if i % len(records) != rank]
        counts = record[epoch]["stats"]
        assert theirs and counts["peer_hits"] == len(theirs) <= counts["records_received"]


def test_a_partitioned_epoch_saved_on_2_nodes_resumes_on_3_then_on_2_each_sample_once(saved_mid_epoch):
    """Rank 0's state, loaded by 3 new ranks that take 3 batches each (no workers), then by 2 that take the
    rest and the next epoch: each part is the next stretch of the epoch's one order, every sample once, each
    rank's records of other nodes sent by them as it walks its part; the next epoch is torch's."""
    folder, saved = saved_mid_epoch
    on_three = restart(folder, "three", str(folder / "saved.pt"), world=3, take=3, workers=0)
    on_two = restart(folder, "two", str(folder / "three.pt"), world=2, take=-1, workers=1)
    order, batch = torch_order(1, 0, epoch=1), resume_job.BATCH
    reached = [0, 2 * 12 * batch, 2 * 12 * batch + 3 * 3 * batch, resume_job.RECORDS]
    for phase, start, end in zip((saved, on_three, on_two), reached[:-1], reached[1:], strict=True):
        assert sorted(samples(phase)) == sorted(order[start:end])
    assert sorted(samples(saved) + samples(on_three) + samples(on_two)) == list(range(resume_job.RECORDS))
    assert_other_nodes_sent_theirs(on_three, "resumed")
    assert_other_nodes_sent_theirs(on_two, "resumed")
    assert [record["next"]["samples"] for record in on_two] == [torch_order(2, r, epoch=2) for r in (0, 1)]
    assert_other_nodes_sent_theirs(on_two, "next")


def test_a_partitioned_epoch_resumes_on_as_many_nodes_where_each_rank_left_off(saved_mid_epoch):
    folder, saved = saved_mid_epoch
    again = restart(folder, "again", str(folder / "saved.pt"), world=2, take=-1, workers=1)
    for rank in (0, 1):  # what the job went on to take, had it not stopped
        went_on = torch_order(2, rank, epoch=1)
        assert saved[rank]["resumed"]["samples"] + again[rank]["resumed"]["samples"] == went_on
        assert again[rank]["next"]["samples"] == torch_order(2, rank, epoch=2)
    assert sorted(samples(saved) + samples(again)) == list(range(resume_job.RECORDS))
    assert_other_nodes_sent_theirs(again, "resumed")
    assert_other_nodes_sent_theirs(again, "next")
