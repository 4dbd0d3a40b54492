"""The cache and the memory it has: ``cache_bytes="auto"`` and the pause in admission when memory is short."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import MemorySource, first_index

import loader.system.memory
from loader import DataLoader, SourceDataset
from loader.cache import MinIOCache
from loader.cache._admission import AdmissionGate
from loader.cache._layout import index_bytes
from loader.cache.minio import TAKES_AHEAD
from loader.system import forkgrowth, headroom
from loader.system.memory import MemoryView, format_bytes
from loader.system.sizing import reserve_bytes
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import probe_storage_conditions
from stallbench.conditions.storage import evict_page_cache, resident_bytes

MIB = 1 << 20
RECORDS, SIZE = 64, 512
LIMIT = 2560 * MIB  # where the cache keeps RESERVE free (5%) whatever the job's own memory
RESERVE = 128 * MIB
CLOSE = 8 * MIB  # free memory within the last 16 MiB of the limit: the store gives back
HERE = Path(__file__).parent


def free(headroom: int, limit: int = 16 << 30) -> MemoryView:
    return MemoryView(headroom=headroom, limit=limit, source="a test's memory")


@pytest.fixture
def memory(monkeypatch):
    """Set what the memory view reports: ``memory(view)``."""
    return lambda view: monkeypatch.setattr(loader.system.memory, "memory_view", lambda: view)


def dataset(nbytes: int | None = RECORDS * SIZE) -> SourceDataset:
    source = MemorySource(RECORDS, SIZE)
    source.nbytes = nbytes
    return SourceDataset(source, transform=first_index)


def make(shm_dir, cache_bytes, **kwargs) -> DataLoader:
    return DataLoader(
        dataset(), batch_size=8, shuffle=True, cache_bytes=cache_bytes, cache_dir=shm_dir, **kwargs
    )


def indices(dl: DataLoader) -> list[int]:
    return sorted(int(i) for batch, _ in dl for i in batch)


def test_auto_with_ample_memory_holds_the_whole_dataset(shm_dir, memory):
    memory(free(8 << 30))
    dl = make(shm_dir, "auto")
    s = dl.stats()
    assert s.cache_capacity == RECORDS * SIZE + index_bytes(RECORDS)
    assert "the dataset's size" in s.cache_sizing and "a test's memory" in s.cache_sizing
    assert indices(dl) == list(range(RECORDS))
    assert indices(dl) == list(range(RECORDS)) and dl.stats().hits == RECORDS


def test_auto_under_a_limit_takes_the_headroom_less_the_reserve(shm_dir, memory):
    view = free(RESERVE + index_bytes(RECORDS) + 20 * SIZE, limit=LIMIT)
    memory(view)
    dl = make(shm_dir, "auto")
    s = dl.stats()
    assert s.cache_capacity == view.headroom - reserve_bytes(view)
    assert "kept free" in s.cache_sizing
    list(dl)
    assert dl.stats().records_cached == 20


def test_auto_without_the_dataset_size_is_bounded_by_memory(shm_dir, memory):
    view = free(1 << 30, limit=2 << 30)
    memory(view)
    dl = DataLoader(dataset(nbytes=None), batch_size=8, cache_bytes="auto", cache_dir=shm_dir)
    assert dl.stats().cache_capacity == view.headroom - reserve_bytes(view)


def test_auto_with_no_memory_free_makes_no_cache_and_says_so(shm_dir, memory):
    memory(free(10 * MIB))
    with pytest.warns(RuntimeWarning, match="makes no cache .0 Bytes: 10.0 MiB free per a test's memory"):
        dl = make(shm_dir, "auto")
    assert dl.cache is None and "kept free" in dl.stats().cache_sizing
    assert indices(dl) == list(range(RECORDS))


def test_auto_uses_an_existing_store_as_it_is_and_says_so(shm_dir, memory):
    make(shm_dir, 10_000).cache.close()
    memory(free(8 << 30))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dl = make(shm_dir, "auto")
    assert dl.stats().cache_capacity == 10_000
    assert "already held this data" in dl.stats().cache_sizing


@pytest.mark.parametrize("bad", ["half", "50%", ""])
def test_a_cache_size_that_is_not_a_number_or_auto_is_refused(shm_dir, bad):
    with pytest.raises(
        ValueError, match=f"cache_bytes must be a positive number of bytes, 'auto' or None, got {bad!r}"
    ):
        make(shm_dir, bad)


def test_short_memory_pauses_admission_warns_once_and_loses_nothing(shm_dir, memory):
    memory(free(1 << 30, limit=LIMIT))
    dl = make(shm_dir, 1 << 20)
    memory(free(RESERVE + 10 * SIZE, limit=LIMIT))  # the job grew: room for 10 records above the reserve
    with pytest.warns(RuntimeWarning, match="memory is short") as caught:
        assert indices(dl) == list(range(RECORDS))
    assert len([w for w in caught if "memory is short" in str(w.message)]) == 1
    s = dl.stats()
    assert s.records_cached == 10 and s.memory_pauses == 1
    held = f"memory ran short: it holds {format_bytes(s.cache_bytes_used)} (admission paused)"
    assert s.cache_sizing == held  # an explicit size: only what it reached
    assert "a test's memory" in str(caught[0].message) and str(dl.cache.path) in str(caught[0].message)


def test_whether_the_store_takes_a_record_is_asked_without_pausing_or_warning(shm_dir, memory):
    memory(free(RESERVE + 10 * SIZE, limit=LIMIT))  # room for 10 records above the reserve
    opened = [
        MinIOCache.open(fingerprint=fp * 32, num_records=4, capacity=index_bytes(4) + n, cache_dir=shm_dir)
        for fp, n in (("cd", 64 * SIZE), ("ef", TAKES_AHEAD * SIZE))
    ]
    roomy, small = opened
    most = 10 * SIZE // TAKES_AHEAD  # the store says it takes a record where memory has room for that many
    try:
        assert roomy.takes(0, most) and not roomy.takes(0, most + 1)
        assert roomy.memory_pauses == 0 and roomy.takes(0, most)  # asking took nothing, paused nothing
        memory(free(1 << 30, limit=LIMIT))  # read by the small store's first question
        assert small.takes(0, SIZE // 2) and small.admit(0, bytes(SIZE // 2))
        assert small.takes(1, SIZE // 2) and not small.takes(1, SIZE)  # the store's own room, ahead
    finally:
        for store in opened:
            store.close()


@pytest.mark.multiproc
def test_short_memory_pauses_admission_in_every_worker(shm_dir, memory):
    memory(free(1 << 30, limit=LIMIT))
    dl = make(shm_dir, 1 << 20, num_workers=2)
    memory(free(RESERVE + 10 * SIZE, limit=LIMIT))  # the job grew: room for 10 records above the reserve
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the workers inherit this: their one warning each goes nowhere
        assert indices(dl) == list(range(RECORDS))
    s = dl.stats()
    assert s.records_cached <= 20 and s.memory_pauses >= 2  # each worker noticed


# The real thing: a job in a memory cgroup.

RECORD_BYTES, FILES = 256 << 10, 600  # 150 MiB of records


@pytest.fixture(scope="module")
def big_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("mem") / "imgs"
    problems = probe_storage_conditions(root.parent)
    if problems["memory_limit"] is not None:
        pytest.skip(f"needs a memory cgroup: {problems['memory_limit']}")
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(FILES // 2):
            (root / f"c{c}" / f"{i}.jpg").write_bytes(rng.bytes(RECORD_BYTES))
    return root


def run_job(
    limits: StorageLimits, root: Path, cache_dir: Path, cache_bytes: str, epochs: int = 2, grow_mib: int = 0
):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    script = str(HERE / "_memory_job.py")
    argv = [sys.executable, script, str(root), str(cache_dir), cache_bytes, str(epochs), str(grow_mib)]
    done = limits.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, f"the job died (status {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def job_memory(root: Path, cache_dir: Path, runs: int = 1) -> int:
    """The job's own peak memory without a cache: the cgroup's peak less the records in the page cache; the
    largest of ``runs`` runs (one run under load read low once, and its limit left no room to admit)."""
    peaks = []
    for _ in range(runs):
        evict_page_cache(root)
        with StorageLimits() as limits:
            run_job(limits, root, cache_dir, "none", epochs=1)
        peaks.append(limits.memory_max_usage() - resident_bytes(root))
    return max(peaks)


@pytest.mark.multiproc
@pytest.mark.slow
def test_at_a_limit_of_cache_plus_job_memory_the_job_completes_and_warns(big_folder, shm_dir):
    cache_bytes = FILES * RECORD_BYTES
    limit = job_memory(big_folder, shm_dir, runs=2) + cache_bytes
    evict_page_cache(big_folder)
    with StorageLimits(memory_limit=limit) as limits:
        stats, stderr = run_job(limits, big_folder, shm_dir, str(cache_bytes))
    assert stats["samples"] == 2 * FILES
    assert stats["memory_pauses"] >= 1 and "memory is short" in stderr
    assert 0 < stats["records_cached"] < FILES, (limit, stats, stderr[-2000:])


@pytest.mark.multiproc
@pytest.mark.slow
def test_auto_under_a_cgroup_limit_picks_a_size_within_it(big_folder, shm_dir):
    limit = job_memory(big_folder, shm_dir) + 256 * MIB  # the reserve (up to 128 MiB) and the rest for data
    evict_page_cache(big_folder)
    with StorageLimits(memory_limit=limit) as limits:
        stats, _ = run_job(limits, big_folder, shm_dir, "auto")
    assert stats["samples"] == 2 * FILES
    assert 0 < stats["cache_capacity"] < limit
    assert "cgroup v1 memory limit" in stats["cache_sizing"]
    assert stats["cache_bytes_used"] <= stats["cache_capacity"]


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_job_that_grows_after_its_cache_filled_gets_memory_back_and_is_not_killed(big_folder, shm_dir):
    limit = job_memory(big_folder, shm_dir) + 200 * MIB  # the cache fills to 200 MiB less what it keeps free
    evict_page_cache(big_folder)
    with StorageLimits(memory_limit=limit) as limits:
        stats, stderr = run_job(limits, big_folder, shm_dir, "auto", epochs=3, grow_mib=150)  # > the reserve
    assert stats["samples"] == 3 * FILES
    assert stats["cached_after_epoch1"] * RECORD_BYTES >= 48 * MIB
    assert "gave back" in stderr and "grew into the memory the cache keeps free" in stderr
    assert stats["records_cached"] * RECORD_BYTES <= stats["cached_after_epoch1"] * RECORD_BYTES - 16 * MIB


@pytest.mark.parametrize(
    ("headroom", "missing", "crowded"),
    [
        (100 * MIB, 100 * MIB, False),  # 50 MiB beside the store's 50: as much as it holds
        (80 * MIB, 100 * MIB, True),  # 30 MiB beside it: neither its 50 nor the 100 it misses
        (80 * MIB, 20 * MIB, False),  # 30 MiB beside it hold the 20 it misses
        (20 * MIB, 100 * MIB, True),
    ],
)
def test_a_store_on_disk_is_crowded_where_the_memory_beside_it_holds_neither_it_nor_its_misses(
    memory, headroom, missing, crowded
):
    memory(free(headroom, limit=LIMIT))  # the store's 50 MiB are page cache: in the headroom
    gate = AdmissionGate(Path("a store"), in_memory=False)
    asked = []
    assert gate.crowded(np.array([50 * MIB]), lambda: asked.append(1) or missing) is crowded
    assert gate.crowded(np.array([50 * MIB]), lambda: asked.append(1) or missing) is crowded
    assert len(asked) <= 1  # the misses are counted once per look at the memory
    assert not AdmissionGate(Path("b store"), in_memory=False).crowded(np.array([0]), lambda: missing)


def test_a_store_on_disk_past_the_job_s_peak_is_not_crowded_by_the_memory_that_peak_took(memory, monkeypatch):
    """The page cache gives memory back at the job's peak (an evaluation) and may use it in between: what
    crowds the store is the memory free now, not beside the peak that admission keeps free."""
    clock = [1000.0]
    monkeypatch.setattr(headroom, "monotonic", lambda: clock[0])
    gate, used = AdmissionGate(Path("a store"), in_memory=False), np.array([50 * MIB])
    memory(free(60 * MIB, limit=LIMIT))  # at the peak: 10 MiB beside the store's 50
    assert gate.crowded(used, lambda: 100 * MIB)
    clock[0] += 1
    memory(free(200 * MIB, limit=LIMIT))  # the peak passed: 150 MiB beside it now
    assert not gate.crowded(used, lambda: 100 * MIB)
    with pytest.warns(RuntimeWarning, match="memory is short"):
        assert gate.memory_short(1, used)  # admission still keeps the peak's memory free


def test_a_thread_that_gave_back_between_another_s_look_and_its_warning_leaves_the_warning_whole(memory):
    memory(free(CLOSE, limit=LIMIT))  # overdrawn
    gate, used = AdmissionGate(Path("a store")), np.array([64 * MIB])
    asked = gate.overdrawn(used)  # one read-ahead thread asks...
    gate.note_given_back(0, 0)  # ...another gives back first (nothing left for it) and forgets the reading
    with pytest.warns(RuntimeWarning, match=r"8.0 MiB free per a test's memory, 128.0 MiB kept free"):
        gate.note_given_back(asked, 3)
    assert gate.given_back == asked == 2 * 16 * MIB - CLOSE


def test_records_given_back_are_read_from_the_source_and_the_loader_warns_once(shm_dir, memory):
    memory(free(1 << 30, limit=LIMIT))
    dl = make(shm_dir, 1 << 20)
    assert indices(dl) == list(range(RECORDS)) and dl.stats().records_cached == RECORDS
    memory(free(CLOSE, limit=LIMIT))  # the job grew through the reserve to within 16 MiB of its limit
    time.sleep(0.06)  # the gauge looks again after 50 ms
    with pytest.warns(RuntimeWarning, match="grew into the memory the cache keeps free") as caught:
        assert indices(dl) == list(range(RECORDS))
    assert len([w for w in caught if "gave back" in str(w.message)]) == 1
    s = dl.stats()
    assert s.records_cached == 0 and (s.hits, s.misses) == (0, 2 * RECORDS)  # epoch 2 read all again
    assert s.cache_bytes_given_back == RECORDS * SIZE and s.records_admitted == RECORDS
    own = format_bytes(LIMIT - CLOSE - RECORDS * SIZE)  # the store's bytes were in the usage (a tmpfs)
    said = f"gave back {format_bytes(RECORDS * SIZE)} ({RECORDS} records) when the job's own memory"
    assert s.cache_sizing == f"{said} reached {own} of its {format_bytes(LIMIT)} limit"


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_the_store_makes_room_for_the_reserve_before_the_loader_starts_workers(
    shm_dir, memory, persistent_workers
):
    memory(free(1 << 30, limit=LIMIT))
    dl = make(shm_dir, 1 << 20)
    assert indices(dl) == list(range(RECORDS)) and dl.stats().records_cached == RECORDS
    short = RECORDS * SIZE // 2  # the job grew into the reserve: half the store's bytes short of it
    memory(free(RESERVE - short, limit=LIMIT))
    workers = DataLoader(
        dl.dataset, batch_size=8, num_workers=1, persistent_workers=persistent_workers, cache_dir=shm_dir
    )
    with pytest.warns(RuntimeWarning, match="gave back"):
        assert indices(workers) == list(range(RECORDS))
    assert dl.stats().records_cached == RECORDS - short // SIZE  # the records admitted last, given back


def test_the_store_makes_room_for_what_earlier_workers_grew_the_job_by(shm_dir, memory, monkeypatch):
    memory(free(1 << 30, limit=LIMIT))
    dl = make(shm_dir, 1 << 20)
    assert indices(dl) == list(range(RECORDS)) and dl.stats().records_cached == RECORDS
    monkeypatch.setattr(forkgrowth, "_most_per_worker", 100 * MIB)  # as measured of earlier workers
    short = RECORDS * SIZE // 4
    memory(free(2 * 100 * MIB + 16 * MIB - short, limit=LIMIT))  # the reserve (128 MiB) is free
    workers = DataLoader(dl.dataset, batch_size=8, num_workers=2, cache_dir=shm_dir)
    with pytest.warns(RuntimeWarning, match="about to as workers start"):
        assert indices(workers) == list(range(RECORDS))
    assert dl.stats().records_cached == RECORDS - short // SIZE  # room for two workers and the margin


def test_a_store_with_the_reserve_free_gives_nothing_back_before_workers_start(shm_dir, memory):
    memory(free(1 << 30, limit=LIMIT))
    dl = make(shm_dir, 1 << 20, num_workers=1)
    assert indices(dl) == list(range(RECORDS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert indices(dl) == list(range(RECORDS))
    assert dl.stats().records_cached == RECORDS and dl.stats().hits == RECORDS
