"""The OS facts both packages need, each told in one place: the mount table (``loader.system.mounts``),
evicting a file's pages, dirty ones included (``loader.system.pagecache.evict_written_back``), and whether
data lives in object storage (``loader.sources.locations``)."""

from __future__ import annotations

import os

import pytest

from loader.sources import in_object_storage, split_url
from loader.system.mounts import Mount, mount_of, mounts, parse_mounts
from loader.system.pagecache import evict_written_back, resident_count
from stallbench.conditions.mounts import filesystem_type
from stallbench.conditions.storage import in_object_storage as stallbench_says

TABLE = (
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "35 22 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "36 22 0:32 /jobs /mnt/my\\040data rw master:3 - xfs /dev/vdb rw,noatime\n"
)


def test_the_mount_table_is_read_whole_with_its_roots_options_and_escapes():
    assert parse_mounts(TABLE) == [
        Mount("/", "/", "ext4", frozenset({"rw"})),
        Mount("/", "/sys/fs/cgroup/memory", "cgroup", frozenset({"rw", "memory"})),
        Mount("/jobs", "/mnt/my data", "xfs", frozenset({"rw", "noatime"})),
    ]


def test_a_path_is_on_the_deepest_mount_above_it_for_both_packages(tmp_path):
    here = mount_of(tmp_path)
    assert str(tmp_path).startswith(here.point) and here in mounts()
    assert filesystem_type(tmp_path) == here.fstype  # stallbench asks the loader's table
    assert mount_of("/dev/shm").fstype == filesystem_type("/dev/shm") == "tmpfs"


def test_a_file_just_written_leaves_the_page_cache_whole(tmp_path):
    path = tmp_path / "dirty.bin"
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20))  # dirty pages: the advice alone leaves them
    assert evict_written_back(path) == 1 << 20
    fd = os.open(path, os.O_RDONLY)
    try:
        assert resident_count(fd, 1 << 20) == 0
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError):
        evict_written_back(tmp_path / "gone")


@pytest.mark.parametrize(
    ("location", "remote"),
    [("s3://bucket/prefix", True), ("s3://b", True), ("/data/s3://x", False), ("data", False)],
)
def test_object_storage_is_told_one_way(location, remote):
    assert in_object_storage(location) is remote
    assert stallbench_says(location) is remote


def test_an_object_location_splits_into_bucket_and_prefix_or_is_named_as_bad():
    assert split_url("s3://bucket/a/b") == ("bucket", "a/b/")
    assert split_url("s3://bucket") == ("bucket", "")
    for bad in ("s3:///key", "http://bucket/key", "bucket/key"):
        with pytest.raises(ValueError, match="s3://bucket/prefix, got"):
            split_url(bad)
