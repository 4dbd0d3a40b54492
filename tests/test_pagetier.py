"""Records kept in the page cache where memory is too short for the store (``loader/cache/_pagetier.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import loader
import loader.system.memory
from loader import DataLoader
from loader.cache import MinIOCache
from loader.cache._layout import EMPTY, PAGED, UNHIT, index_bytes
from loader.cache._pagetier import page_bytes
from loader.cache._tiercost import TierCost
from loader.system.memory import MemoryView
from loader.system.pagecache import PAGE
from stallbench.conditions.storage import resident_bytes

MIB = 1 << 20
LIMIT = 2560 * MIB  # the reserve is 5% of it, 128 MiB: any headroom under that is short for the store
SLACK = 4 * MIB  # what the kept records leave of the spare memory
N = 40
FP = "cd" * 32


@pytest.fixture
def headroom(monkeypatch):
    """Set the memory the job may still take, under a 2.5 GiB limit: ``headroom(nbytes)``."""

    def set_to(nbytes: int) -> None:
        view = MemoryView(headroom=nbytes, limit=LIMIT, source="a test's memory")
        monkeypatch.setattr(loader.system.memory, "memory_view", lambda: view)

    return set_to


@pytest.fixture
def tier_pays(monkeypatch):
    """The tier pays whatever the reads cost here (a local disk's reads are quick: whether it pays is
    measured, and tested on its own)."""
    monkeypatch.setattr(TierCost, "pays", lambda self, misses_per_kept: True)


def open_store(shm_dir) -> MinIOCache:
    store = MinIOCache.open(fingerprint=FP, num_records=N, capacity=1 << 20, cache_dir=shm_dir)
    store._gate._gauge.interval = 0  # every question reads the memory view afresh
    return store


def test_with_memory_to_spare_pages_are_left_to_the_kernel(shm_dir, headroom):
    headroom(1 << 30)
    store = open_store(shm_dir)
    assert store.keeps_pages(3, 5_000, ours=True)
    assert store._state[3] == EMPTY and store.paged == 0
    assert not store.tier_pays()  # a read the store does not admit is a plain read, as before the tier


def test_where_memory_is_short_records_are_kept_while_their_pages_fit(shm_dir, headroom):
    headroom(SLACK + 3 * PAGE)
    store = open_store(shm_dir)
    with pytest.warns(RuntimeWarning, match="memory is short"):
        assert not store.admit(0, b"x" * 100)  # short for the store: it admits nothing
    assert store.keeps_pages(0, 100, ours=True)  # one page
    assert store.keeps_pages(1, PAGE + 1, ours=True)  # two
    assert not store.keeps_pages(2, 1, ours=True)  # a fourth page would eat into the slack
    assert [int(store._state[i]) for i in range(3)] == [PAGED, PAGED, EMPTY]
    assert store.paged == 3 * PAGE and store.info().bytes_paged == 3 * PAGE
    assert store.info().records_cached == 0  # kept in the page cache is not held by the store
    assert store.tier_pays()


def test_pages_another_reader_brought_in_are_never_evicted(shm_dir, headroom):
    headroom(SLACK)  # nothing fits
    store = open_store(shm_dir)
    assert store.keeps_pages(5, 100, ours=False)
    assert store._state[5] == EMPTY and store.paged == 0


def test_a_kept_record_found_cold_is_kept_no_longer_nor_more_than_are_kept_then(shm_dir, headroom):
    """What the kernel leaves kept records is learned: where it took one, no more are kept than are kept
    then, and each kept record found still there lets one more in."""
    headroom(SLACK + 4 * PAGE)
    store = open_store(shm_dir)
    assert store.keeps_pages(0, 100, ours=True) and store.keeps_pages(1, 100, ours=True)
    assert not store.keeps_pages(1, 100, ours=True)  # found cold: the kernel took its pages
    assert store._state[1] == EMPTY and store.paged == PAGE
    assert not store.keeps_pages(2, 100, ours=True)  # memory says 3 more pages, the kernel left 1
    assert store.keeps_pages(0, 100, ours=False)  # a kept record found warm: room for one more
    assert store.keeps_pages(2, 100, ours=True) and store.paged == 2 * PAGE
    assert [int(store._state[i]) for i in range(3)] == [PAGED, EMPTY, PAGED]


def test_a_kept_record_the_store_admits_later_leaves_the_page_cache_at_its_first_hit(shm_dir, headroom):
    headroom(SLACK + PAGE)
    store = open_store(shm_dir)
    assert store.keeps_pages(7, 100, ours=True) and store.paged == PAGE
    headroom(1 << 30)  # memory to spare in another process: it admits, its read having found the pages warm
    other = open_store(shm_dir)
    assert other.admit(7, b"y" * 100, False)
    assert store._state[7] == UNHIT and store.paged == 0
    assert other.get(7) == b"y" * 100 and other.first_hit(7)  # the caller evicts the pages now


def test_an_offer_evicts_what_is_neither_admitted_nor_kept_and_survives_a_failing_eviction(shm_dir, headroom):
    headroom(SLACK)
    store = open_store(shm_dir)
    evicted = []
    with pytest.warns(RuntimeWarning, match="memory is short"):
        assert not store.offer(2, b"z" * 100, True, lambda: evicted.append(2), 1e-3)
    assert evicted == [2]

    def fails() -> None:
        raise OSError("the device went away")

    assert not store.offer(3, b"z" * 100, True, fails, 1e-3)  # advisory: no error reaches the read
    assert not store.offer(4, b"z" * 100, False, lambda: evicted.append(4), 1e-3)  # not ours: left alone
    assert evicted == [2]


def test_the_tier_pays_where_the_reads_it_saves_outweigh_its_work_on_every_miss():
    cost = TierCost()
    for _ in range(31):
        cost.note_read(4e-4, 3_000)
        cost.note_work(1e-4)
    assert cost.pays(10.0)  # too few measured to tell
    cost.note_read(4e-4, 3_000)
    cost.note_work(1e-4)
    assert cost.pays(1.5) and cost.pays(4.0) and not cost.pays(5.0)  # a read is 4 works
    assert cost.record_bytes == pytest.approx(3_000)
    for _ in range(200):  # the storage slowed down: reads of 1 ms
        cost.note_read(1e-3, 3_000)
    assert cost.pays(9.0) and cost.read_seconds == pytest.approx(1e-3, rel=0.01)


@pytest.mark.filterwarnings("ignore:memory is short:RuntimeWarning")
def test_where_reads_from_storage_are_quick_a_read_is_neither_kept_nor_evicted(shm_dir, headroom):
    """Small records from fast storage: the tier's work would cost more than the hits it buys."""
    headroom(SLACK)
    store = open_store(shm_dir)
    evicted = []

    def evict() -> None:
        time.sleep(1e-3)  # the tier's work: 1 ms a read, against reads of 10 us
        evicted.append(1)

    for i in range(32):
        store.offer(i % N, b"z" * 100, True, evict, 1e-5)
    assert len(evicted) == 32 and not store.tier_pays()
    store.offer(0, b"z" * 100, True, evict, 1e-5)
    assert len(evicted) == 32


def test_page_bytes_count_whole_pages():
    assert [page_bytes(n) for n in (0, 1, PAGE, PAGE + 1)] == [0, PAGE, PAGE, 2 * PAGE]
    assert page_bytes(np.array([1, PAGE, 3 * PAGE - 1])) == 5 * PAGE


ATTACH = """
import sys, time
from loader.cache import MinIOCache
s = MinIOCache.open(fingerprint=sys.argv[2], num_records=int(sys.argv[3]), capacity=1 << 20,
                    cache_dir=sys.argv[1], warn_capacity=False)
with s._mutex.held():
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.mark.multiproc
def test_a_stopped_lock_holder_never_stalls_a_read_and_a_killed_one_frees_the_tier(shm_dir, headroom):
    headroom(SLACK + 4 * PAGE)
    store = open_store(shm_dir)
    argv = [sys.executable, "-c", ATTACH, str(shm_dir), FP, str(N)]
    holder = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        os.kill(holder.pid, signal.SIGSTOP)
        start = time.monotonic()
        assert not store.keeps_pages(0, 100, ours=True)  # not marked: the caller evicts, as when full
        assert time.monotonic() - start < store._mutex.timeout / 2
        assert store._state[0] == EMPTY and store.paged == 0
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert store.keeps_pages(0, 100, ours=True) and store._state[0] == PAGED
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()


@pytest.mark.filterwarnings("ignore:memory is short:RuntimeWarning")  # said once per process
@pytest.mark.parametrize("num_workers", [0, 2])
def test_short_memory_keeps_some_records_in_the_page_cache_and_reads_only_the_rest(
    cold_images, shm_dir, headroom, tier_pays, num_workers
):
    """The kept records stay in the page cache and come from memory in epoch 2; every other record read
    leaves it at once, so nothing pushes the kept ones out."""
    paths = sorted(cold_images.rglob("*.jpg"))
    sizes = [p.stat().st_size for p in paths]
    room = page_bytes(sizes[:12])  # about 12 of the 32 records
    headroom(SLACK + room)
    dl = DataLoader(
        loader.ImageFolder(cold_images, transform=len),
        batch_size=8,
        shuffle=True,
        num_workers=num_workers,
        cache_bytes=index_bytes(32) + (1 << 20),
        cache_dir=shm_dir,
    )
    assert sorted(int(n) for batch, _ in dl for n in batch) == sorted(sizes)
    s = dl.stats()
    kept = [p for p, state in zip(paths, dl.dataset._cache._state, strict=True) if state == PAGED]
    kept_bytes = sum(p.stat().st_size for p in kept)
    assert s.records_cached == 0 and 0 < len(kept) < 32
    assert s.page_cache_bytes == page_bytes([p.stat().st_size for p in kept]) <= room
    assert resident_bytes(cold_images) == pytest.approx(kept_bytes, abs=PAGE * len(kept))
    assert sorted(int(n) for batch, _ in dl for n in batch) == sorted(sizes)
    read = dl.stats().bytes_from_storage - s.bytes_from_storage
    assert read == pytest.approx(sum(sizes) - kept_bytes, abs=PAGE * 32)
    now_kept = [p for p, state in zip(paths, dl.dataset._cache._state, strict=True) if state == PAGED]
    assert set(kept) <= set(now_kept)  # a record that fits in what is left may join in epoch 2
    assert resident_bytes(cold_images) == pytest.approx(
        sum(p.stat().st_size for p in now_kept), abs=PAGE * len(now_kept)
    )


@pytest.mark.filterwarnings("ignore:memory is short:RuntimeWarning")
def test_a_users_own_files_are_kept_in_the_page_cache_too(cold_images, shm_dir, headroom, tier_pays):
    paths = sorted(cold_images.rglob("*.jpg"))
    headroom(SLACK + page_bytes([p.stat().st_size for p in paths[:5]]))
    files = loader.CachedFiles(cold_images, index_bytes(32) + (1 << 20), cache_dir=shm_dir)
    files._caches[0]._gate._gauge.interval = 0
    first = [files.read(p) for p in paths]
    kept = [p for p, state in zip(paths, files._caches[0]._state, strict=True) if state == PAGED]
    assert kept == paths[:5]  # read in order: the first five fit
    assert resident_bytes(cold_images) == pytest.approx(sum(p.stat().st_size for p in kept), abs=5 * PAGE)
    assert files.infos()[0].bytes_paged == page_bytes([p.stat().st_size for p in kept])
    assert first == [(p.read_bytes(), False) for p in paths]
