"""Several processes on one cache: workers, separate jobs, and a worker killed during the fill."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from _crashed_job import fingerprint
from conftest import _MAKER
from helpers import MemorySource, first_index, index_of, make_jpeg_folder

from loader import DataLoader, ImageFolder, SourceDataset
from loader.cache._layout import index_bytes

pytestmark = pytest.mark.multiproc
N, SIZE = 96, 4096


def job(cache_dir: str, out) -> None:
    """One training job: two workers, one epoch over the shared cache; reports its stats."""
    dl = DataLoader(
        SourceDataset(MemorySource(N, SIZE), transform=first_index),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        cache_bytes=index_bytes(N) + N * SIZE,
        cache_dir=cache_dir,
    )
    seen = sorted(i for b in dl for i in b[0].tolist())
    s = dl.stats()
    out.put((seen, s.hits, s.misses, s.records_admitted, s.records_cached))


def test_two_jobs_with_two_workers_share_one_cache(shm_dir):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    for _ in range(2):  # the second job starts after the first: it finds the cache warm
        p = ctx.Process(target=job, args=(str(shm_dir), out))
        p.start()
        first = out.get(timeout=120)
        p.join(60)
        assert p.exitcode == 0
        if _ == 0:
            assert first[0] == list(range(N)) and first[1:] == (0, N, N, N)
        else:
            assert first[0] == list(range(N)) and first[1:] == (N, 0, 0, N)


def test_two_jobs_at_once_fill_it_together(shm_dir):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=job, args=(str(shm_dir), out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert all(r[0] == list(range(N)) for r in results)
    assert sum(r[3] for r in results) == N  # each record admitted once, by one of them
    assert results[0][4] == results[1][4] == N


class SlowSource(MemorySource):
    def read(self, index: int) -> bytes:
        time.sleep(0.005)
        return super().read(index)


def test_worker_killed_during_fill_loses_nothing_and_leaves_no_torn_record(shm_dir):
    def make():
        return DataLoader(
            SourceDataset(SlowSource(N, SIZE), transform=first_index),
            batch_size=4,
            num_workers=2,
            timeout=60,
            cache_bytes=index_bytes(N) + N * SIZE,
            cache_dir=shm_dir,
        )

    dl = make()
    it = iter(dl)
    next(it)
    victim = it._workers[0].pid
    with pytest.raises(RuntimeError, match=f"(?i)worker.*{victim}"):
        os.kill(victim, signal.SIGKILL)  # while it prefetches: its share of the epoch is still to come
        for _ in it:
            pass
    it._shutdown_workers()  # the surviving worker stops too, so what the cache holds is settled
    cache = dl.cache
    held = [i for i in range(N) if cache.get(i) is not None]
    assert held and all(index_of(cache.get(i)) == i and len(cache.get(i)) == SIZE for i in held)
    again = make()
    assert sorted(i for b in again for i in b[0].tolist()) == list(range(N))  # the cache is reusable
    s = again.stats()
    assert s.hits == len(held) and s.records_cached >= len(held)


def test_stats_are_summed_over_workers(shm_dir):
    dl = DataLoader(
        SourceDataset(MemorySource(N, SIZE), transform=first_index),
        batch_size=8,
        num_workers=2,
        cache_bytes=1 << 22,
        cache_dir=shm_dir,
    )
    list(dl)
    s = dl.stats()
    assert (s.misses, s.samples, s.batches_collated) == (N, N, N // 8)
    assert s.bytes_from_source == N * SIZE and s.fetch_seconds > 0
    assert isinstance(torch.utils.data.get_worker_info(), type(None))


def test_spawned_workers_share_the_cache(shm_dir):
    def run():
        dl = DataLoader(
            SourceDataset(MemorySource(N, SIZE), transform=first_index),
            batch_size=8,
            num_workers=2,
            multiprocessing_context="spawn",
            cache_bytes=1 << 22,
            cache_dir=shm_dir,
        )
        seen = sorted(i for b in dl for i in b[0].tolist())
        return seen, dl.stats()

    first, second = run(), run()
    assert first[0] == second[0] == list(range(N))
    assert (first[1].records_admitted, second[1].hits, second[1].misses) == (N, N, 0)


@pytest.mark.multiproc
@pytest.mark.parametrize("workers", [2, 1])
def test_num_workers_set_after_the_loader_is_made_counts_every_read(shm_dir, workers):
    """torch lets ``num_workers`` change after construction; every worker then gets its own counters."""
    source = MemorySource(16)
    dl = DataLoader(SourceDataset(source), batch_size=4, cache_bytes=1 << 20, cache_dir=shm_dir)
    assert [raw for batch in dl for raw in batch[0]] == source.records  # in-process: fills the cache
    # torch's own loader needs both set: with prefetch_factor None it fails as well
    dl.num_workers, dl.prefetch_factor = workers, 2
    assert sorted(raw for batch in dl for raw in batch[0]) == sorted(source.records)
    stats = dl.stats()
    assert (stats.misses, stats.hits) == (16, 16)
    assert stats.samples == 32


def test_a_killed_job_leaves_no_worker_behind():
    """The job's process is SIGKILLed with its result pipe full: its workers leave within the orphan grace
    (torch's own loop would return, then wait for ever to send its last batches)."""
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    from loader.transport.orphan_guard import ORPHAN_GRACE

    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    job = subprocess.Popen(
        [sys.executable, str(here / "_orphan_job.py")],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    workers = [psutil.Process(int(pid)) for pid in job.stdout.readline().split()]
    assert len(workers) == 2
    job.kill()
    job.wait()
    job.stdin.close()  # not communicate(): the workers hold the same pipes
    job.stdout.close()
    _, alive = psutil.wait_procs(workers, timeout=ORPHAN_GRACE + 15)
    for orphan in alive:
        orphan.kill()
    assert not alive, [p.pid for p in alive]


def test_a_job_killed_whole_leaves_nothing_in_dev_shm_and_its_restart_reads_right(tmp_path):
    """The peers' users' crash (issue 46): every process of a job SIGKILLed while its workers admit records to
    the cache; nothing of its processes is left in /dev/shm, and the job started again gives every batch
    whole (each against torch's loader over the same images) and reads what was admitted from the cache."""
    data = make_jpeg_folder(tmp_path / "data", per_class=40, classes=2)
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    argv = [sys.executable, str(here / "_crashed_job.py"), str(data), str(tmp_path / "cache")]
    (tmp_path / "cache").mkdir()
    job = subprocess.Popen([*argv, "50"], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    tree: list[psutil.Process] = []
    try:
        batches = [job.stdout.readline() for _ in range(8)]  # 8 of the first epoch's 20: records admitted
        assert all(batches), "the job ended before its eighth batch"
        tree = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
        assert len(tree) == 3  # the job and its two workers
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        job.stdout.close()
    psutil.wait_procs(tree, timeout=10)
    pids = {p.pid for p in tree}
    made = [(name, _MAKER.match(name)) for name in os.listdir("/dev/shm")]
    assert not [name for name, maker in made if maker and int(maker[1]) in pids]
    again = subprocess.run([*argv, "2"], env=env, text=True, capture_output=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    *batches, counts = again.stdout.splitlines()
    plain = torch.utils.data.DataLoader(ImageFolder(data, transform="eval"), batch_size=4)
    expected = [fingerprint(images, labels) for images, labels in plain]
    assert batches == expected * 2
    counts = json.loads(counts)
    assert counts["hits"] + counts["misses"] == 2 * 80 and counts["hits"] >= 80 + 8 * 4  # 8 batches admitted
