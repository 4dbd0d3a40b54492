"""What reaches the storage device and the page cache, as the kernel counts it."""

from __future__ import annotations

import errno

import pytest
from helpers import make_jpeg_folder

import loader
from loader import DataLoader
from loader.cache import MinIOCache
from loader.cache._layout import index_bytes
from stallbench.conditions.limits import probe_storage_conditions
from stallbench.conditions.storage import evict_page_cache, resident_bytes


def folder_bytes(root) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.jpg"))


@pytest.fixture
def cold_images(tmp_path):
    reason = probe_storage_conditions(tmp_path)["page_cache_eviction"]
    if reason is not None:
        pytest.fail(f"this test needs page cache eviction on {tmp_path}: {reason}")
    root = make_jpeg_folder(tmp_path / "imgs", per_class=16, size=(400, 300))
    evict_page_cache(root)
    assert resident_bytes(root) == 0
    return root


@pytest.mark.parametrize("num_workers", [0, 2])
def test_records_the_cache_takes_never_enter_the_page_cache(cold_images, shm_dir, num_workers):
    """A cold record the cache takes in epoch 1 is read around the page cache: it lives once, in our cache."""
    dl = DataLoader(
        loader.ImageFolder(cold_images, transform=len),
        batch_size=8,
        num_workers=num_workers,
        cache_bytes=1 << 24,
        cache_dir=shm_dir,
    )
    list(dl)
    total = folder_bytes(cold_images)
    assert resident_bytes(cold_images) < 0.05 * total
    s = dl.stats()
    assert s.bytes_from_storage >= total  # the kernel saw every byte come from the device
    assert s.bytes_from_source == total and s.records_cached == 32
    before = s.bytes_from_storage
    list(dl)
    assert dl.stats().bytes_from_storage - before < 0.05 * total  # second epoch: all from the cache
    assert resident_bytes(cold_images) < 0.05 * total  # the records live once: in our cache


def test_records_given_back_before_any_hit_are_read_again_whole(cold_images, shm_dir):
    """A store that gives back records it read around the page cache, before it ever served them (memory ran
    short), has them in neither cache: they come from the device again, whole, and are admitted again."""
    dl = DataLoader(
        loader.ImageFolder(cold_images, transform=len), batch_size=8, cache_bytes=1 << 24, cache_dir=shm_dir
    )
    lengths = [int(n) for batch, _ in dl for n in batch]
    store = dl.dataset._cache
    held = store.used
    assert store.give_back(held) == (held, 32)
    total = folder_bytes(cold_images)
    assert resident_bytes(cold_images) < 0.05 * total
    before = dl.stats().bytes_from_storage
    assert [int(n) for batch, _ in dl for n in batch] == lengths
    assert dl.stats().bytes_from_storage - before >= total and dl.stats().records_cached == 32


def test_without_the_cache_the_page_cache_is_left_as_torch_leaves_it(cold_images):
    list(DataLoader(loader.ImageFolder(cold_images, transform=len), batch_size=8))
    assert resident_bytes(cold_images) >= 0.95 * folder_bytes(cold_images)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_half_the_dataset_cached_and_ample_memory_reads_nothing_after_epoch_1(
    cold_images, shm_dir, num_workers
):
    """What the cache admits lives there alone; what it does not stays in the page cache, as with torch. The
    store has room for fewer than ``TAKES_AHEAD`` of these records ahead, so each is read through the page
    cache, and an admitted one's pages go at its first hit."""
    total = folder_bytes(cold_images)
    dl = DataLoader(
        loader.ImageFolder(cold_images, transform=len),
        batch_size=8,
        shuffle=True,
        num_workers=num_workers,
        cache_bytes=total // 2,
        cache_dir=shm_dir,
    )
    list(dl)
    s = dl.stats()
    admitted = s.cache_bytes_used - index_bytes(32)
    assert 0 < s.records_cached < 32 and 0.3 * total < admitted <= total // 2
    assert resident_bytes(cold_images) >= 0.95 * total
    list(dl)
    assert dl.stats().bytes_from_storage - s.bytes_from_storage < 0.02 * total
    assert resident_bytes(cold_images) == pytest.approx(total - admitted, abs=0.02 * total)


def test_pages_warm_before_the_loader_stay_warm(cold_images, shm_dir):
    """Another job's warm pages are not evicted, even for records the cache admits."""
    for path in cold_images.rglob("*.jpg"):
        path.read_bytes()
    total = folder_bytes(cold_images)
    assert resident_bytes(cold_images) == total
    dl = DataLoader(
        loader.ImageFolder(cold_images, transform=len), batch_size=8, cache_bytes=1 << 24, cache_dir=shm_dir
    )
    list(dl)
    list(dl)  # every record served from the cache
    assert dl.stats().records_cached == 32 and dl.stats().hits == 32
    assert resident_bytes(cold_images) == total


def test_a_users_own_files_through_cache_files_never_enter_the_page_cache(cold_images, shm_dir):
    """``CachedFiles`` (``DataLoader(cache_files=...)``): as for our datasets, a cold file the store takes is
    read around the page cache."""
    files = loader.CachedFiles(cold_images, 1 << 24, cache_dir=shm_dir)
    paths = sorted(cold_images.rglob("*.jpg"))
    total = folder_bytes(cold_images)
    first = [files.read(p) for p in paths]
    assert [info.records_cached for info in files.infos()] == [32]
    assert resident_bytes(cold_images) < 0.05 * total
    again = [files.read(p) for p in paths]
    assert resident_bytes(cold_images) < 0.05 * total
    assert first == [(p.read_bytes(), False, True) for p in paths] and again == [
        (p.read_bytes(), True, False) for p in paths
    ]


def test_a_hit_is_served_whatever_evicting_its_pages_meets(cold_images, shm_dir):
    class EvictFails(loader.ImageFolderSource):
        def evict(self, index: int) -> None:
            raise OSError(errno.EIO, "the device went away")

    dl = DataLoader(
        loader.SourceDataset(EvictFails(cold_images), transform=len),
        batch_size=8,
        cache_bytes=1 << 24,
        cache_dir=shm_dir,
    )
    first = [batch[0].tolist() for batch in dl]
    again = [batch[0].tolist() for batch in dl]
    assert again == first and dl.stats().hits == 32


def test_a_users_own_file_is_served_from_the_store_whatever_evicting_its_pages_meets(
    cold_images, shm_dir, monkeypatch
):
    """``CachedFiles`` serves a hit through the same path as our datasets: an eviction that fails is
    advisory."""

    def evict_fails(path: str) -> None:
        raise OSError(errno.EIO, f"the device went away under {path}")

    monkeypatch.setattr(loader.serving.files, "evict_file", evict_fails)
    files = loader.CachedFiles(cold_images, 1 << 24, cache_dir=shm_dir)
    paths = sorted(cold_images.rglob("*.jpg"))
    assert [files.read(p)[1] for p in paths] == [False] * 32
    assert [files.read(p) for p in paths] == [(p.read_bytes(), True, False) for p in paths]


@pytest.mark.parametrize("crowded", [False, True])
def test_the_misses_of_a_store_crowded_on_disk_are_read_around_the_page_cache(
    cold_images, disk, monkeypatch, crowded
):
    """Where the store on a disk holds more than the memory left beside it (``MinIOCache.crowded``), the
    records it misses are read around the page cache, whose pages would push the store's out; else they stay
    in it, as torch's loader leaves them."""
    total = folder_bytes(cold_images)
    dl = DataLoader(
        loader.ImageFolder(cold_images, transform=len), batch_size=8, cache_bytes=total // 2, cache_dir=disk
    )
    list(dl)  # epoch 1 fills the store with half the records
    held = dl.stats().records_cached
    assert 0 < held < 32 and not dl.cache.in_memory
    evict_page_cache(cold_images)
    monkeypatch.setattr(MinIOCache, "crowded", lambda self: crowded)
    lengths = sorted(int(n) for batch, _ in dl for n in batch)
    assert lengths == sorted(p.stat().st_size for p in cold_images.rglob("*.jpg"))
    missed = total - (dl.stats().cache_bytes_used - index_bytes(32))
    assert dl.stats().records_cached == held and dl.stats().hits == held
    assert resident_bytes(cold_images) == pytest.approx(0 if crowded else missed, abs=0.03 * total)
