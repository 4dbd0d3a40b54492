"""Reads around the page cache (``loader.system.direct``): whole bytes, in the device's own blocks, leaving
the page cache and the descriptor as they were; None where the filesystem refuses."""

from __future__ import annotations

import fcntl
import os

import pytest

from loader.system.direct import _buffer, read_direct
from stallbench.conditions.storage import evict_page_cache, resident_bytes


def content(size: int) -> bytes:
    return bytes(range(256)) * (size // 256) + bytes(size % 256)


def written(folder, name: str, size: int) -> str:
    path = str(folder / name)
    with open(path, "wb") as f:
        f.write(content(size))
    return path


def device_bytes_read() -> int:
    """Bytes this process has had read from storage (``/proc/self/io``)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


@pytest.mark.parametrize("size", [1, 511, 512, 513, 4095, 4097, 100_001, 1 << 20])
def test_a_direct_read_gives_the_file_leaving_the_page_cache_and_the_descriptor_alone(disk, size):
    path = written(disk, "f", size)
    evict_page_cache(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        assert read_direct(fd, size) == content(size)
        assert resident_bytes(path) == 0 and fcntl.fcntl(fd, fcntl.F_GETFL) == flags
    finally:
        os.close(fd)


def test_small_files_read_directly_take_fewer_bytes_from_storage_than_whole_pages(disk):
    paths = [written(disk, f"{i}.jpg", 3000) for i in range(200)]  # 6 blocks of 512 bytes; a 4 KiB page
    taken = {}
    for how in ("buffered", "direct"):
        evict_page_cache(paths)
        before, got = device_bytes_read(), []
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            got.append(read_direct(fd, 3000) if how == "direct" else os.read(fd, 1 << 16))
            os.close(fd)
        taken[how] = device_bytes_read() - before
        assert got == [content(3000)] * len(paths)
    assert taken["buffered"] >= 200 * 4096 and taken["direct"] <= 200 * 3072


def test_a_file_shorter_than_asked_a_big_one_or_a_filesystem_that_refuses_gives_none(disk):
    path = written(disk, "short", 1000)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_direct(fd, 2000) is None and read_direct(fd, 0) is None
    finally:
        os.close(fd)
    path = written(disk, "big", (1 << 20) + 1)  # read as usual: a block saves it nothing worth a copy
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_direct(fd, (1 << 20) + 1) is None
    finally:
        os.close(fd)
    fd = os.open("/proc/self/status", os.O_RDONLY)  # procfs takes no O_DIRECT
    try:
        assert read_direct(fd, 100) is None
    finally:
        os.close(fd)


def test_a_forked_process_reads_into_a_buffer_of_its_own(disk):
    """The buffer outlives a read; a worker forked after its parent read must not read into the parent's."""
    parents = written(disk, "a", 3000)
    childs = disk / "b"
    childs.write_bytes(b"b" * 2000)  # unlike the parent's bytes at every offset
    fd = os.open(parents, os.O_RDONLY)
    try:
        assert read_direct(fd, 3000) == content(3000)  # the parent's buffer now holds its file
    finally:
        os.close(fd)
    pid = os.fork()
    if pid == 0:  # the child reads another file into its buffer, then leaves at once, whatever happens
        code = 1
        try:
            code = 0 if read_direct(os.open(childs, os.O_RDONLY), 2000) == b"b" * 2000 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _buffer(3000)[:3000] == content(3000)  # not the child's bytes
