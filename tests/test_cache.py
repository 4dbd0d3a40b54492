"""The MinIO store on its own: admission, capacity, sharing between processes, killed writers."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import stat
import warnings

import pytest
from helpers import MemorySource

from loader.cache import Admission, CorruptRecordError, MinIOCache, store_path
from loader.cache._layout import HEADER_BYTES, RESERVED, SLOT_DTYPE, index_bytes
from loader.fetching.fetched import fetch_raw

N = 40
FP = "ab" * 32


def record(i: int, size: int = 1000) -> bytes:
    return bytes([i % 251]) * size + i.to_bytes(4, "little")


def open_store(shm_dir, capacity: int, n: int = N) -> MinIOCache:
    return MinIOCache.open(fingerprint=FP, num_records=n, capacity=capacity, cache_dir=shm_dir)


def test_admits_until_full_then_never_evicts(shm_dir):
    data_room = 10 * len(record(0))
    cache = open_store(shm_dir, index_bytes(N) + data_room)
    admitted = [i for i in range(N) if cache.admit(i, record(i))]
    assert admitted == list(range(10))
    assert all(cache.get(i) == record(i) for i in admitted)
    assert all(cache.get(i) is None for i in range(10, N))
    info = cache.info()
    assert (info.records_cached, info.full, info.bytes_used) == (10, True, info.capacity)


def test_a_mutable_read_is_a_private_copy_and_the_store_stays_closable(shm_dir):
    cache = open_store(shm_dir, 1 << 20)
    assert cache.admit(4, record(4))
    mine = cache.get(4, mutable=True)
    assert isinstance(mine, bytearray) and mine == record(4)
    mine[:4] = b"xxxx"  # the store's copy is not touched
    assert cache.get(4) == record(4) and cache.get(4, mutable=True) == record(4)
    assert cache.get(5, mutable=True) is None
    cache.close()  # no view of the mapping is left behind (closing would raise BufferError)


def test_admitting_twice_keeps_the_first_copy(shm_dir):
    cache = open_store(shm_dir, 1 << 20)
    assert cache.admit(3, record(3))
    assert not cache.admit(3, b"other")
    assert cache.get(3) == record(3)
    assert cache.info().records_cached == 1


def test_store_survives_the_process_and_is_private(shm_dir):
    first = open_store(shm_dir, 1 << 20)
    first.admit(5, record(5))
    first.close()
    again = open_store(shm_dir, 1 << 20)
    assert again.get(5) == record(5)
    path = store_path(shm_dir, FP)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()} == {0o600}


def test_other_capacity_reuses_the_store_with_a_warning(shm_dir):
    open_store(shm_dir, 1 << 20).admit(1, record(1))
    with pytest.warns(RuntimeWarning, match="made with capacity"):
        again = open_store(shm_dir, 2 << 20)
    assert again.capacity == 1 << 20 and again.get(1) == record(1)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "1G"])
def test_bad_capacity_names_the_option(shm_dir, bad):
    with pytest.raises(ValueError, match="cache_bytes"):
        open_store(shm_dir, bad)


def test_capacity_smaller_than_the_index_is_refused(shm_dir):
    with pytest.raises(ValueError, match="cannot hold even the index"):
        open_store(shm_dir, index_bytes(N))


def test_missing_cache_dir_is_named(tmp_path):
    with pytest.raises(ValueError, match="no-such-dir"):
        MinIOCache.open(fingerprint=FP, num_records=N, capacity=1 << 20, cache_dir=tmp_path / "no-such-dir")


def test_a_store_whose_record_count_is_damaged_is_made_anew(shm_dir):
    first = open_store(shm_dir, 1 << 20)
    first.admit(1, record(1))
    first._header["num_records"] = N + 7  # a stray write into the user's own store
    with pytest.warns(RuntimeWarning, match=f"counts {N + 7} records where its data has {N}.*made anew"):
        again = open_store(shm_dir, 1 << 20)
    assert again.get(1) is None and again.admit(1, record(1)) and again.get(1) == record(1)


def test_full_shared_memory_stops_admitting_with_one_warning(shm_dir):
    cache = open_store(shm_dir, 1 << 20)
    os.close(cache._data_fd)
    cache._data_fd = os.open("/dev/full", os.O_RDWR)  # every write fails with ENOSPC, as a full tmpfs does
    with pytest.warns(RuntimeWarning, match="no space left") as seen:
        results = [cache.admit(i, record(i)) for i in range(5)]
    assert results == [False] * 5 and len(seen) == 1
    assert cache.info().full and cache.info().records_cached == 0


def test_admitting_many_takes_the_lock_once_and_writes_them_in_one_call(shm_dir, monkeypatch):
    cache = open_store(shm_dir, 1 << 20)
    assert cache.admit(3, record(3), identity=103)
    held, writes, real_held, real_pwritev = [], [], cache._mutex.held, os.pwritev
    monkeypatch.setattr(cache._mutex, "held", lambda *a: held.append(a) or real_held(*a))
    monkeypatch.setattr(
        os, "pwritev", lambda fd, bufs, at: writes.append(len(bufs)) or real_pwritev(fd, bufs, at)
    )
    offered = [Admission(i, record(i), i % 2 == 1, 100 + i) for i in (1, 2, 3, 4, 2, 5)]  # 3 held, 2 twice
    assert cache.admit_many(offered) == [True, True, False, True, False, True]
    assert (len(held), writes) == (1, [4])
    assert [cache.get(i) for i in range(7)] == [
        None,
        record(1),
        record(2),
        record(3),
        record(4),
        record(5),
        None,
    ]
    assert [int(cache._identity[i]) for i in (1, 2, 4, 5)] == [101, 102, 104, 105]
    assert [cache.first_hit(i) for i in (1, 2, 4, 5)] == [True, False, False, True]  # evict_on_hit kept


def test_a_short_write_admits_the_records_written_whole_and_stops_admitting(shm_dir, monkeypatch):
    cache = open_store(shm_dir, 1 << 20)
    size = len(record(0))
    monkeypatch.setattr(os, "pwritev", lambda fd, bufs, at: os.pwrite(fd, b"".join(bufs)[: 2 * size + 9], at))
    with pytest.warns(RuntimeWarning, match="no space left") as seen:
        results = cache.admit_many([Admission(i, record(i)) for i in range(4)])
    assert results == [True, True, False, False] and len(seen) == 1
    assert [cache.get(i) for i in range(4)] == [record(0), record(1), None, None]
    assert cache.info().full and not cache.admit(5, record(5))


def test_admitting_many_asks_memory_for_each_as_one_admission_asks(shm_dir, monkeypatch):
    cache = open_store(shm_dir, 1 << 20)
    gauge, size = cache._gate._gauge, len(record(0))
    monkeypatch.setattr(gauge, "_due", lambda adding: False)  # the memory as read: 2.5 records spare
    monkeypatch.setattr(cache._gate, "_memory_left", lambda: "test")
    gauge.last, gauge.spare, gauge.reserve, gauge._noted = object(), 10 * size // 4, 0, 0
    with pytest.warns(RuntimeWarning, match="memory is short"):
        admitted = cache.admit_many([Admission(i, record(i)) for i in range(5)])
    assert admitted == [True, True, False, False, False]
    assert gauge._noted == 2 * size  # each counted once as taken; the third would leave memory short


def test_a_reader_holding_records_is_told_the_store_takes_no_more_than_room_for_them(shm_dir):
    cache = open_store(shm_dir, index_bytes(N) + 40 * len(record(0)))
    size = len(record(0))
    assert cache.takes(0, size) and cache.takes(0, size, held=24 * size)
    assert not cache.takes(0, size, held=25 * size)  # 16 more records' room beyond what is held


def _fill(path_dir, start: int, step: int) -> None:
    cache = open_store(path_dir, 1 << 22)
    for i in range(start, N, step):
        cache.admit(i, record(i, 3000))


@pytest.mark.multiproc
def test_processes_fill_one_store_together(shm_dir):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_fill, args=(shm_dir, k, 1)) for k in range(3)]  # all race for every record
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    cache = open_store(shm_dir, 1 << 22)
    assert all(cache.get(i) == record(i, 3000) for i in range(N))
    assert cache.info().bytes_used == index_bytes(N) + N * len(record(0, 3000))  # no record stored twice


def _die_mid_insert(path_dir, index: int) -> None:
    cache = open_store(path_dir, 1 << 20)
    (offset,) = cache._reserve_all([Admission(index, bytes(5000))])
    os.pwrite(cache._data_fd, b"\x01" * 100, offset)  # half the payload, then the writer dies
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.multiproc
def test_writer_killed_mid_insert_leaves_no_torn_record(shm_dir):
    ctx = mp.get_context("fork")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only writes
        proc = ctx.Process(target=_die_mid_insert, args=(shm_dir, 7))
        proc.start()
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    cache = open_store(shm_dir, 1 << 20)
    assert cache._state[7] == RESERVED and cache.get(7) is None  # never read as a record
    assert cache.admit(8, record(8)) and cache.get(8) == record(8)  # the lock was released: still usable


def test_threads_of_one_process_fill_one_store_together(shm_dir):
    from concurrent.futures import ThreadPoolExecutor

    cache = open_store(shm_dir, 1 << 22)
    with ThreadPoolExecutor(8) as pool:  # all race for every record, from a cache object none has used
        admitted = sum(pool.map(lambda i: cache.admit(i % N, record(i % N, 3000)), range(8 * N)))
    assert admitted == N and all(cache.get(i) == record(i, 3000) for i in range(N))
    assert cache.info().bytes_used == index_bytes(N) + N * len(record(0, 3000))


def data_pages(cache: MinIOCache) -> int:
    return os.stat(cache.path / "data").st_blocks * 512


def test_give_back_drops_the_records_admitted_last_and_frees_their_pages(shm_dir):
    big = 64 << 10
    cache = open_store(shm_dir, 1 << 22)
    for i in range(N):
        assert cache.admit(i, record(i, big))
    before = data_pages(cache)
    freed, dropped = cache.give_back(10 * len(record(0, big)))
    assert (freed, dropped) == (10 * len(record(0, big)), 10)
    assert before - data_pages(cache) >= freed - 4096  # tmpfs gave the pages back (bar the one cut through)
    assert [cache.get(i) for i in range(N - 10)] == [record(i, big) for i in range(N - 10)]
    assert [cache.get(i) for i in range(N - 10, N)] == [None] * 10
    assert cache.info().records_cached == N - 10 and not cache.info().full
    assert cache.admit(N - 1, record(N - 1, big)) and cache.get(N - 1) == record(N - 1, big)  # room again


def test_give_back_cuts_at_a_record_boundary_and_keeps_a_record_being_written(shm_dir):
    cache = open_store(shm_dir, 1 << 20)
    for i in range(6):
        cache.admit(i, record(i))
    cache._state[4] = RESERVED  # a live writer's record: it and all below it stay
    size = len(record(0))
    assert cache.give_back(size + size // 2) == (size, 1)  # half a record asked: the whole last one goes
    assert [cache.get(i) for i in (0, 1, 2, 3)] == [record(i) for i in (0, 1, 2, 3)]
    assert cache.get(5) is None and cache._state[4] == RESERVED


def test_a_record_is_served_only_while_its_source_gives_the_identity_it_was_admitted_with(shm_dir):
    asked: list[int] = []

    def seven(index: int) -> int:
        asked.append(index)
        return 7

    assert open_store(shm_dir, 1 << 20).admit(1, record(1), identity=7)
    cache = open_store(shm_dir, 1 << 20)  # as another process finds the store
    assert [cache.get(1, seven), cache.get(1, seven)] == [record(1)] * 2 and asked == [1]  # once a process
    rewritten = open_store(shm_dir, 1 << 20)
    assert rewritten.get(1, lambda index: 8) is None and rewritten.get(1, lambda index: 8) is None
    assert rewritten.admit(1, record(2), identity=8)  # its file rewritten: taken again, in new space
    assert rewritten.get(1, lambda index: 8) == record(2)
    assert open_store(shm_dir, 1 << 20).get(1, seven) is None  # the old bytes are no one's now


class _Rewritten(MemorySource):
    """Record 0's identity as a file's would read: ``identities`` in turn, the last one kept."""

    changes = True

    def __init__(self, identities: list[int]) -> None:
        super().__init__(4)
        self.identities, self.asked = identities, 0

    def identity(self, index: int) -> int:
        self.asked += 1
        return self.identities[min(self.asked, len(self.identities)) - 1]


@pytest.mark.parametrize("changed_during_the_read", [False, True])
def test_the_process_that_admits_a_record_asks_its_identity_again_once_read(shm_dir, changed_during_the_read):
    source = _Rewritten([5, 6] if changed_during_the_read else [5])
    cache = open_store(shm_dir, 1 << 20)
    fetched = fetch_raw(cache, source, 0, 0.0, False, lambda index: False)
    assert (fetched.admitted, fetched.identity, source.asked) == (True, 5, 2)  # before and after the read
    again = fetch_raw(cache, source, 0, 0.0, False, lambda index: False)
    if changed_during_the_read:  # held under the identity before the read: not served, read and taken again
        assert (again.hit, again.admitted, again.identity, source.asked) == (False, True, 6, 5)
        again = fetch_raw(cache, source, 0, 0.0, False, lambda index: False)
    assert again.hit and again.raw == source.read(0)
    assert source.asked == (5 if changed_during_the_read else 2)  # a hit found the same asks no more


def test_a_reader_of_a_slot_given_back_gets_no_wrong_bytes(shm_dir):
    big = 64 << 10
    cache = open_store(shm_dir, 1 << 22)
    for i in range(4):
        cache.admit(i, record(i, big))
    slot = slice(HEADER_BYTES + SLOT_DTYPE.itemsize * 3, HEADER_BYTES + SLOT_DTYPE.itemsize * 4)
    stale = bytes(cache._map[slot])  # a slot looked up just before
    cache.give_back(len(record(3, big)))
    cache._map[slot] = stale
    with pytest.raises(CorruptRecordError, match=r"record 3 .* fails its checksum"):
        cache.get(3)


def test_a_record_admitted_with_its_pages_left_is_held_and_its_first_hit_says_so_once(shm_dir):
    cache = open_store(shm_dir, 1 << 20)
    assert cache.admit(1, record(1), evict_on_hit=True) and cache.admit(2, record(2))
    assert cache.info().records_cached == 2
    assert cache.get(1) == record(1) and cache.get(2) == record(2)
    assert [cache.first_hit(1), cache.first_hit(1), cache.first_hit(2)] == [True, False, False]
    assert cache.get(1) == record(1)
    assert open_store(shm_dir, 1 << 20).first_hit(1) is False  # said once for every process


def test_a_record_given_back_before_its_first_hit_is_not_revived_by_it(shm_dir):
    cache = open_store(shm_dir, 1 << 20)
    for i in range(3):
        assert cache.admit(i, record(i), evict_on_hit=True)
    assert cache.give_back(len(record(2))) == (len(record(2)), 1)
    assert cache.first_hit(2) is False and cache.get(2) is None and cache.info().records_cached == 2
    assert cache.admit(2, record(2)) and cache.get(2) == record(2)  # admitted again later
