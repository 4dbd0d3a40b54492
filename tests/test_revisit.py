"""The form of record revisited while the cache fills (``loader.form.revisit``): a store's movable limit, the
costs measured on the job's own records, the split moved where they say, a stopped or killed lock holder,
and a loader whose probe saw slow storage moving its room to prepared records mid-epoch."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.utils.data

from loader import DataLoader, EvalTransform, ImageFolder, Staged
from loader.cache import MinIOCache, index_bytes
from loader.form import choice as _forms
from loader.form.choice import probe
from loader.form.revisit import FormRevisit, measured
from loader.form.weighing import Probe, weigh
from loader.stats.loader_stats import LoaderStats
from loader.system.locks import LockTimeout
from loader.system.pagecache import drop_file
from stallbench.workloads import make_jpeg_folder

N = 64
PROBE = Probe(
    fetch=0.03, prepare=2e-3, augment=1e-4, whole=2e-3, raw_bytes=1000, prepared_bytes=2000, unpack=1e-4
)


def store(shm_dir, name: str, capacity: int, limit: int | None = None, timeout: float = 5.0) -> MinIOCache:
    return MinIOCache.open(
        fingerprint=name * 8,
        num_records=N,
        capacity=capacity,
        cache_dir=shm_dir,
        limit=limit,
        lock_timeout=timeout,
        warn_capacity=False,
    )


# a process attaching to a store as it is: python -c ATTACH+code cache_dir fingerprint records
ATTACH = """
import sys, time
from loader.cache import MinIOCache
s = MinIOCache.open(
    fingerprint=sys.argv[2], num_records=int(sys.argv[3]), capacity=1 << 20, cache_dir=sys.argv[1],
    warn_capacity=False,
)
"""


def attach(shm_dir, fingerprint: str, records: int, code: str) -> list[str]:
    return [sys.executable, "-c", ATTACH + code, str(shm_dir), fingerprint, str(records)]


def test_a_store_holds_no_more_than_its_limit_and_admits_again_once_raised(shm_dir):
    s = store(shm_dir, "a", index_bytes(N) + 10_000, limit=2_500)
    assert s.limit == 2_500 and s.info().capacity == index_bytes(N) + 2_500
    assert [s.admit(i, bytes([i]) * 1_000) for i in range(3)] == [True, True, False]
    assert s.set_limit(500) == 2_000  # never below what it holds: a store never evicts
    assert not s.accepting(3)
    assert s.set_limit(1 << 40) == 10_000  # never past its data file
    assert s.admit(3, b"\3" * 1_000)
    again = store(shm_dir, "a", index_bytes(N) + 99, limit=7)  # another attach: the shared limit, as it is
    assert again.limit == 10_000 and again.get(3) == b"\3" * 1_000
    made_full = store(shm_dir, "b", index_bytes(N) + 10_000, limit=0)
    assert made_full.info().full and not made_full.admit(0, b"x")


@pytest.mark.multiproc
def test_a_limit_moved_in_one_process_holds_in_another(shm_dir):
    s = store(shm_dir, "c", index_bytes(N) + 10_000, limit=0)
    run = attach(shm_dir, "c" * 8, N, 'print(s.admit(5, b"five"), s.limit)')
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.split() == ["False", "0"]
    s.set_limit(4_000)
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.split() == ["True", "4000"]
    assert s.get(5) == b"five"


def _holds_the_lock(shm_dir, name: str) -> subprocess.Popen:
    """A process that takes store ``name``'s lock and holds it until killed (it says when it has it)."""
    code = 'with s._mutex.held():\n    print("held", flush=True)\n    time.sleep(600)\n'
    proc = subprocess.Popen(attach(shm_dir, name * 8, N, code), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _stats(**counts) -> LoaderStats:
    return LoaderStats(**counts)


def _split(shm_dir, probe_: Probe, room: int, timeout: float = 5.0) -> FormRevisit:
    """A raw choice over two fresh stores of ``room`` bytes each, all the room raw."""
    choice = weigh(probe_, N, room, 2, index_bytes(N))
    assert choice.form == "raw"
    raw = store(shm_dir, "r", index_bytes(N) + room, limit=room, timeout=timeout)
    prepared = store(shm_dir, "p", index_bytes(N) + room, limit=0, timeout=timeout)
    return FormRevisit(choice, raw, prepared, N, workers=2)


# what a job whose misses come quick from the device measures: each sample the whole transform
QUICK = {"misses": 32, "miss_seconds": 32 * 1e-4, "bytes_from_source": 32_000, "bytes_from_storage": 32_000}
QUICK |= {"samples_whole": 32, "decode_seconds": 32 * 2e-3, "hits": 0}


def test_measured_takes_the_jobs_own_costs_in_place_of_the_probes():
    m = measured(PROBE, _stats(**QUICK | {"decode_seconds": 32 * 4e-3, "bytes_from_storage": 8_000}))
    assert m.fetch == pytest.approx(1e-4) and m.raw_bytes == pytest.approx(1_000)
    assert (m.whole, m.prepare, m.augment, m.unpack) == pytest.approx((4e-3, 4e-3, 2e-4, 2e-4))  # CPU x2
    assert m.from_storage == pytest.approx(0.25)
    few = measured(PROBE, _stats(misses=3, miss_seconds=3.0, samples_whole=3, decode_seconds=9.0))
    assert few == PROBE  # too few records measured: the probe's costs stand


def test_the_revisit_moves_the_room_not_yet_filled_where_the_measurements_say(shm_dir):
    room = 40_000  # every record raw; 20 of 64 prepared
    revisit = _split(shm_dir, PROBE, room)
    for i in range(8):  # held raw before the revisit: they stay raw
        assert revisit.raw.admit(i, b"r" * 1_000)
    revisit.revisit(_stats(**QUICK | {"misses": 8, "miss_seconds": 8 * 0.03}))  # too few: nothing moves
    assert revisit.revisits == 0 and revisit.prepared.limit == 0
    revisit.revisit(_stats(**QUICK))
    assert revisit.revisits == 1 and revisit.choice.form in ("prepared", "mixed")
    assert revisit.choice.reason.startswith("revisited after 32 records read")
    assert revisit.raw.limit >= 8_000 and revisit.prepared.limit > 0
    assert revisit.raw.limit + revisit.prepared.limit == room
    moved = (revisit.raw.limit, revisit.prepared.limit)
    revisit.revisit(_stats(**QUICK))  # the same measurements again: the split stands
    assert (revisit.raw.limit, revisit.prepared.limit, revisit.revisits) == (*moved, 1)


def test_a_revisit_that_gains_less_than_a_tenth_keeps_the_split(shm_dir):
    revisit = _split(shm_dir, PROBE, 40_000)
    slow = QUICK | {"miss_seconds": 32 * 0.03}  # the misses cost what the probe said: raw is still best
    revisit.revisit(_stats(**slow))
    assert revisit.revisits == 0 and revisit.choice.form == "raw" and revisit.prepared.limit == 0


def test_the_revisits_stop_once_every_record_is_held(shm_dir):
    revisit = _split(shm_dir, PROBE, 70_000)
    for i in range(N):
        assert revisit.raw.admit(i, b"r" * 1_000)
    revisit.revisit(_stats(**QUICK))
    assert revisit.done and revisit.revisits == 0


@pytest.mark.multiproc
@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_stopped_or_killed_lock_holder_never_hangs_the_revisit(shm_dir, how):
    revisit = _split(shm_dir, PROBE, 40_000, timeout=0.5)
    holder = _holds_the_lock(shm_dir, "p")
    try:
        os.kill(holder.pid, how)
        start = time.monotonic()
        revisit.revisit(_stats(**QUICK))
        waited = time.monotonic() - start
        if how == signal.SIGSTOP:  # its lock is held: the limits stay, for the next point to try again
            assert revisit.revisits == 0 and revisit.prepared.limit == 0 and waited < 5
            with pytest.raises(LockTimeout):
                revisit.prepared.set_limit(1)
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(10)
            revisit.revisit(_stats(**QUICK))
        assert revisit.revisits == 1 and revisit.prepared.limit > 0  # a dead holder's lock is free
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()


@pytest.mark.multiproc
def test_a_stopped_lock_holder_never_stalls_a_first_hit(shm_dir):
    """A hit marks its record served under the store's lock, but waits for it only briefly: with the lock
    held by a stopped process the hit is served at once and the record marked at a later hit."""
    s = store(shm_dir, "h", 1 << 20)
    assert s.admit(0, b"x" * 1_000, True)
    holder = _holds_the_lock(shm_dir, "h")
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        start = time.monotonic()
        assert s.get(0) == b"x" * 1_000 and s.first_hit(0) is False
        assert time.monotonic() - start < s._mutex.timeout / 2  # not the lock's own wait
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert [s.first_hit(0), s.first_hit(0)] == [True, False]
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()


def _slow_prepare(raw: bytes) -> torch.Tensor:
    time.sleep(0.01)  # a costly decode: the epoch is bound by preparation, whatever the device's speed
    return EVAL.prepare(raw)


EVAL = EvalTransform()
SLOW_EVAL = Staged(_slow_prepare, EVAL.augment, identity="slow eval for the revisit test")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_jpeg_folder(tmp_path_factory.mktemp("revisit") / "imgs", num_images=96)


def _evict(root) -> None:
    """Drop the files' pages from the page cache: the epoch reads them from the device."""
    os.sync()
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                drop_file(fd)
            finally:
                os.close(fd)


@pytest.mark.multiproc
def test_a_loader_whose_probe_saw_slow_storage_moves_its_room_to_prepared_records(
    photos, shm_dir, monkeypatch
):
    dataset = ImageFolder(str(photos), transform=SLOW_EVAL)
    key = (dataset.source.fingerprint, SLOW_EVAL.identity)
    monkeypatch.setitem(
        _forms._PROBED, key, dataclasses.replace(probe(dataset), fetch=0.03, from_storage=1.0)
    )
    room = dataset.source.nbytes // 2
    kw = {"batch_size": 4, "num_workers": 2, "timeout": 120}
    dl = DataLoader(dataset, cache_bytes=room + 2 * index_bytes(96), cache_dir=shm_dir, **kw)
    assert dl.stats().cache_form == "raw"  # the probe's slow fetches: hold the most records, raw
    _evict(photos)
    want = [(x.tolist(), y.tolist()) for x, y in torch.utils.data.DataLoader(dataset, **kw)]
    _evict(photos)
    first = [(x.tolist(), y.tolist()) for x, y in dl]
    after_first = dl.stats()
    second = [(x.tolist(), y.tolist()) for x, y in dl]
    stats = dl.stats()
    assert first == want and second == want  # every form gives the uncached samples
    assert after_first.cache_form in ("prepared", "mixed"), after_first.cache_form_reason
    assert after_first.cache_form_reason.startswith("revisited after"), after_first.cache_form_reason
    assert stats.samples_from_prepared > after_first.samples_from_prepared > -1
    held = after_first.records_cached
    assert stats.hits - after_first.hits == held  # each record held once, in one form
    assert stats.samples_from_prepared - after_first.samples_from_prepared > 0
    prepared = dl._opened.stores[1]
    fingerprint = prepared.path.name.removeprefix("minio-")
    restarted = subprocess.run(
        attach(shm_dir, fingerprint, 96, "print(s.limit)"), capture_output=True, text=True, check=True
    )
    assert int(restarted.stdout) == prepared.limit > 0  # the split the job moved is the next run's


def test_a_cache_too_small_for_two_indexes_holds_raw_bytes_in_one_store(photos, shm_dir):
    dataset = ImageFolder(str(photos), transform=EVAL)
    index = index_bytes(len(dataset))
    dl = DataLoader(dataset, batch_size=8, cache_bytes=index + index // 2, cache_dir=shm_dir)
    assert len(dl._opened.stores) == 1 and dl.stats().cache_form == "raw"
    assert sum(len(labels) for _, labels in dl) == len(dataset)  # made before: the two indexes did not fit
