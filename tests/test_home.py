"""Where a cache lives by default, and whether its folder's pages are memory the kernel cannot take back."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import MemorySource, first_index

from loader import DataLoader, SourceDataset
from loader.system.home import CACHE_DIR_VARIABLE, default_cache_dir, holds_memory


def test_the_default_home_is_the_variable_s_folder_else_var_tmp(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv(CACHE_DIR_VARIABLE)
    assert default_cache_dir() == Path("/var/tmp")
    monkeypatch.setenv(CACHE_DIR_VARIABLE, "")
    assert default_cache_dir() == Path("/var/tmp")


def test_a_tmpfs_holds_memory_and_a_disk_does_not(shm_dir, disk):
    assert holds_memory(shm_dir) and holds_memory("/dev/shm")
    assert not holds_memory(disk)
    assert not holds_memory(disk / "not there")  # the kernel will not say: not known to hold memory


def test_a_loader_without_cache_dir_keeps_its_store_in_the_default_home_on_disk(disk, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(disk))
    dl = DataLoader(
        SourceDataset(MemorySource(16, 64), transform=first_index), batch_size=4, cache_bytes=1 << 20
    )
    assert sorted(int(i) for batch, _ in dl for i in batch) == list(range(16))
    assert dl.cache.path.parent.parent == disk and not dl.cache.in_memory
    assert dl.stats().records_cached == 16 and not dl.cache.info().in_memory


def test_a_store_in_a_tmpfs_says_so(shm_dir):
    dl = DataLoader(
        SourceDataset(MemorySource(16, 64), transform=first_index), cache_bytes=1 << 20, cache_dir=shm_dir
    )
    assert dl.cache.in_memory and dl.cache.info().in_memory


@pytest.mark.parametrize("cache_dir", ["shm", "disk"])
def test_a_store_serves_the_same_bytes_in_either_home(cache_dir, shm_dir, disk):
    folder = shm_dir if cache_dir == "shm" else disk
    source = MemorySource(32, 1000)
    dl = DataLoader(
        SourceDataset(source, transform=bytes), batch_size=None, cache_bytes=1 << 20, cache_dir=folder
    )
    first, second = ([raw for raw, _ in dl] for _ in range(2))
    assert first == second == [source.read(i) for i in range(32)]
    assert dl.stats().hits == 32
