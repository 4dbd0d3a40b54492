"""Nothing in a shared folder is trusted: planted folders, tampered files, held locks, killed writers."""

from __future__ import annotations

import fcntl
import hashlib
import multiprocessing as mp
import os
import shutil
import signal
import stat
import warnings

import numpy as np
import pytest
from helpers import MemorySource

from loader import DataLoader, SourceDataset
from loader.cache import Admission, CorruptRecordError, MinIOCache, UntrustedCacheError, store_path
from loader.cache._layout import HEADER_BYTES, SLOT_DTYPE, index_bytes
from loader.cache._storefiles import create_store

N, SIZE = 24, 2048
FP = "cd" * 32
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting as another user needs root to drop to it")


def open_store(cache_dir, capacity: int = 1 << 20, **kw) -> MinIOCache:
    return MinIOCache.open(fingerprint=FP, num_records=N, capacity=capacity, cache_dir=cache_dir, **kw)


def record(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (SIZE // 32)


def filled(cache_dir) -> MinIOCache:
    cache = open_store(cache_dir)
    assert all(cache.admit(i, record(i)) for i in range(N))
    return cache


def slots(cache: MinIOCache) -> np.ndarray:
    """The store's slot table, mapped writable, as an attacker or a stray write would see it."""
    return np.frombuffer(cache._map, SLOT_DTYPE, count=N, offset=HEADER_BYTES)


@pytest.fixture
def shared_dir(shm_dir):
    """A world-writable sticky folder, as /dev/shm is."""
    os.chmod(shm_dir, 0o1777)
    return shm_dir


def _as_nobody(action, *args) -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    action(*args)


def run_as_nobody(action, *args) -> None:
    ctx = mp.get_context("fork")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only makes files
        child = ctx.Process(target=_as_nobody, args=(action, *args))
        child.start()
    child.join(30)
    assert child.exitcode == 0


def plant_store(path) -> None:
    """Another user makes our store's folder ahead of us, open to all (any store could be put in it)."""
    old = os.umask(0)
    try:
        os.mkdir(path.parent, 0o777)
        create_store(path, fingerprint=FP, num_records=N, capacity=1 << 20)
        for p in (path, *path.iterdir()):
            os.chmod(p, 0o777 if p.is_dir() else 0o666)
    finally:
        os.umask(old)


def plant_link(path, target: str) -> None:
    os.symlink(target, path.parent)


PASSED_OVER = rf"was made by another user \(nobody \(uid {NOBODY}\)\), not you: this job uses .*set cache_dir"


@as_root
@pytest.mark.multiproc
def test_a_folder_planted_by_another_user_is_passed_over_and_said_once(shared_dir):
    run_as_nobody(plant_store, store_path(shared_dir, FP))
    user_dir = store_path(shared_dir, FP).parent
    with pytest.warns(RuntimeWarning, match=rf"{user_dir} {PASSED_OVER}"):
        cache = open_store(shared_dir)
    assert cache.path == user_dir.with_name(user_dir.name + "-1") / store_path(shared_dir, FP).name
    assert cache.get(0) is None  # nothing of the planted store is read
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_store(shared_dir).path == cache.path  # said once; every open finds the same folder


@as_root
@pytest.mark.multiproc
def test_a_loader_facing_a_planted_folder_caches_the_true_records_beside_it(shared_dir):
    run_as_nobody(plant_store, store_path(shared_dir, FP))
    source = MemorySource(N, SIZE)
    data = SourceDataset(source, transform=None)
    with pytest.warns(RuntimeWarning, match=PASSED_OVER):
        dl = DataLoader(data, batch_size=None, cache_bytes=1 << 20, cache_dir=shared_dir)
    assert [raw for raw, _ in dl] == source.records
    assert [raw for raw, _ in dl] == source.records and dl.stats().hits == N


@as_root
@pytest.mark.multiproc
def test_a_planted_link_is_not_followed(shared_dir, tmp_path):
    os.chmod(tmp_path, 0o777)
    run_as_nobody(plant_link, store_path(shared_dir, FP), str(tmp_path))
    with pytest.warns(RuntimeWarning, match=PASSED_OVER):
        open_store(shared_dir).admit(0, record(0))
    assert not any(tmp_path.iterdir())


def test_our_own_folder_open_to_others_is_refused(shared_dir):
    user_dir = store_path(shared_dir, FP).parent
    user_dir.mkdir()
    user_dir.chmod(0o777)
    with pytest.raises(UntrustedCacheError, match=r"mode 0777.*others may change it"):
        open_store(shared_dir)


def test_a_store_file_open_to_others_is_refused(shm_dir):
    cache = filled(shm_dir)
    (cache.path / "data").chmod(0o666)
    with pytest.raises(UntrustedCacheError, match=r"data .*mode 0666"):
        open_store(shm_dir)


def test_store_folders_are_made_private(shm_dir):
    cache = open_store(shm_dir)
    for folder in (cache.path.parent, cache.path):
        st = os.lstat(folder)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, os.geteuid())


def swap(table: np.ndarray, i: int, j: int) -> None:
    table[i], table[j] = table[j].copy(), table[i].copy()


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(
            lambda c, s: os.pwrite(c._data_fd, b"\xff", int(s["offset"][3]) + 100), id="flipped-byte"
        ),
        pytest.param(lambda c, s: s["length"].__setitem__(3, 100 << 20), id="length-100MB"),
        pytest.param(lambda c, s: s["length"].__setitem__(3, 2**32 - 1), id="length-4GiB"),
        pytest.param(lambda c, s: s["offset"].__setitem__(3, int(s["offset"][7])), id="offset-elsewhere"),
        pytest.param(lambda c, s: swap(s, 3, 7), id="slots-swapped"),
        pytest.param(lambda c, s: os.truncate(c.path / "data", int(s["offset"][3])), id="data-truncated"),
    ],
)
def test_a_tampered_record_is_never_served(tamper, shm_dir):
    cache = filled(shm_dir)
    tamper(cache, slots(cache))
    with pytest.raises(CorruptRecordError, match=r"record 3|slot 3"):
        open_store(shm_dir).get(3)


def test_the_loader_reads_a_corrupt_record_from_its_source_and_counts_it(shm_dir):
    source = MemorySource(N, SIZE)
    dl = DataLoader(SourceDataset(source), batch_size=None, cache_bytes=1 << 20, cache_dir=shm_dir)
    assert [raw for raw, _ in dl] == source.records  # epoch 1 fills the cache
    s = slots(dl.cache)
    os.pwrite(dl.cache._data_fd, b"\x00" * 8, int(s["offset"][5]))
    os.truncate(dl.cache.path / "data", int(s["offset"][20]) + 10)
    assert [raw for raw, _ in dl] == source.records
    stats = dl.stats()
    assert stats.records_corrupt == N - 20 + 1
    assert stats.hits == 20 - 1 and stats.misses == N + N - 20 + 1


def test_a_damaged_header_of_our_own_store_is_rebuilt(shm_dir):
    cache = filled(shm_dir)
    os.pwrite(os.open(cache.path / "index", os.O_WRONLY), b"garbage!", 0)
    with pytest.warns(RuntimeWarning, match="not a stallbench cache.*made anew"):
        again = open_store(shm_dir)
    assert again.info().records_cached == 0 and again.admit(0, record(0)) and again.get(0) == record(0)


def _hold_lock(path, ready, release) -> None:
    fd = os.open(path / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    release.wait(60)


@pytest.mark.multiproc
def test_a_held_lock_times_out_and_the_loader_reads_on(shm_dir):
    cache = open_store(shm_dir, lock_timeout=0.3)
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(cache.path, ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.warns(RuntimeWarning, match=r"held the lock.*admits no records") as seen:
            admitted = [cache.admit(i, record(i)) for i in range(N)]
        assert admitted == [False] * N and len(seen) == 1  # one wait, then admission pauses
        assert cache.get(0) is None
    finally:
        release.set()
        holder.join(30)
    assert holder.exitcode == 0


def _die_mid_insert(cache_dir, index: int, capacity: int) -> None:
    cache = open_store(cache_dir, capacity)
    (offset,) = cache._reserve_all([Admission(index, record(index))])
    os.pwrite(cache._data_fd, b"\x01" * 100, offset)  # half the payload, then the writer dies
    os.kill(os.getpid(), signal.SIGKILL)


def _byte_is_free(path, k: int, out) -> None:
    fd = os.open(path / "writers", os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, k)
        out.put(True)
    except OSError:
        out.put(False)


@pytest.mark.multiproc
def test_a_slot_left_by_a_killed_writer_is_reclaimed_in_place_even_when_full(shm_dir):
    capacity = index_bytes(N) + SIZE  # room for one record: the dead writer's
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_die_mid_insert, args=(shm_dir, 7, capacity))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    cache = open_store(shm_dir, capacity)
    assert cache.get(7) is None and not cache.admit(8, record(8)) and cache.info().full
    assert cache.admit(7, record(7)) and cache.get(7) == record(7)
    assert cache.info().bytes_used == capacity  # its space was reused, not lost
    # this process took the dead writer's byte (the lowest free one) and must still hold it after reclaiming
    out = ctx.Queue()
    checker = ctx.Process(target=_byte_is_free, args=(cache.path, int(cache._writer[7]), out))
    checker.start()
    assert out.get(timeout=60) is False
    checker.join(30)


def _reserve_and_wait(cache_dir, index: int, reserved, release) -> None:
    cache = open_store(cache_dir)
    cache._reserve_all([Admission(index, record(index))])
    reserved.set()
    release.wait(60)


@pytest.mark.multiproc
def test_a_live_writers_slot_is_left_to_it(shm_dir):
    ctx = mp.get_context("spawn")
    reserved, release = ctx.Event(), ctx.Event()
    writer = ctx.Process(target=_reserve_and_wait, args=(shm_dir, 4, reserved, release))
    writer.start()
    try:
        assert reserved.wait(60)
        assert not open_store(shm_dir).admit(4, record(4))
    finally:
        release.set()
        writer.join(30)
    assert writer.exitcode == 0


def test_a_cache_dir_anyone_may_write_without_the_sticky_bit_is_refused(shm_dir):
    os.chmod(shm_dir, 0o777)
    with pytest.raises(UntrustedCacheError, match=r"writable by every user and not sticky"):
        open_store(shm_dir)


@pytest.mark.multiproc
def test_a_store_removed_between_epochs_leaves_training_on_storage(shm_dir):
    source = MemorySource(N, SIZE)
    dl = DataLoader(
        SourceDataset(source),
        batch_size=4,
        num_workers=2,
        multiprocessing_context="spawn",
        cache_bytes=1 << 20,
        cache_dir=shm_dir,
    )
    assert sorted(raw for batch, _ in dl for raw in batch) == sorted(source.records)
    shutil.rmtree(dl.cache.path)  # another job, or a person, removed it
    before = dl.stats()
    assert sorted(raw for batch, _ in dl for raw in batch) == sorted(source.records)
    assert dl.stats().hits == before.hits  # nothing was served from the removed store


def test_a_new_private_file_is_written_whole_and_never_over_a_name_already_there(tmp_path):
    from loader.system.private import write_new

    path = tmp_path / "new"
    parts = [b"head", memoryview(os.urandom(3 << 20)), b"tail"]
    write_new(path, parts)
    assert path.read_bytes() == b"".join(bytes(p) for p in parts)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        write_new(path, [b"other"])  # the file there is left as it was
    assert path.read_bytes() == b"".join(bytes(p) for p in parts)
    planted = tmp_path / "planted"
    planted.symlink_to(tmp_path / "target")
    with pytest.raises(FileExistsError):
        write_new(planted, [b"through the link"])
    assert not (tmp_path / "target").exists()
