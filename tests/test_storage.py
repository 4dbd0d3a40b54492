"""Storage conditions checked against the kernel's own counters: page cache, cgroup limits, cleanup."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stallbench.cli.stops import Stopped, stops_as_ctrl_c
from stallbench.conditions import cgroup
from stallbench.conditions.cgroup import StorageConditionUnavailable, StorageLimits
from stallbench.conditions.limits import probe_storage_conditions
from stallbench.conditions.sizes import format_bytes, parse_size
from stallbench.conditions.storage import (
    PAGE,
    DataSize,
    data_size,
    device_bytes,
    evict_page_cache,
    resident_bytes,
)

MB = 1 << 20


@pytest.fixture(scope="module")
def conditions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    return probe_storage_conditions(tmp_path_factory.getbasetemp())


def need(conditions: dict[str, str | None], *names: str) -> None:
    for name in names:
        if conditions[name] is not None:
            pytest.skip(f"{name} unavailable: {conditions[name]}")


def _cold_file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    evict_page_cache(path)
    return path


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] in ("Z", "X")  # dead, not yet reaped by init
    except FileNotFoundError:
        return True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("4096", 4096),
        ("1.5G", 3 << 29),
        ("1.5g", 3 << 29),
        ("512M", 512 << 20),
        ("512MiB", 512 << 20),
        ("512Mi", 512 << 20),
        ("112KB", 112_000),
        ("112 kB", 112_000),
        ("2GB", 2_000_000_000),
        ("1T", 1 << 40),
        (" 64 K ", 65_536),
        ("0.5K", 512),
        ("10B", 10),
        (123, 123),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("12QB", "'12QB' is not a size"),
        ("-1G", "must not be negative"),
        ("", "is not a size"),
        (-5, "negative"),
        ("G", "is not a size"),
        ("1.2.3M", "is not a size"),
        ("nan", "is not a size"),
        (True, "must be a string"),
    ],
)
def test_parse_size_rejects(text: str | int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_size(text)


def test_evict_then_resident_on_a_16mb_file(tmp_path: Path, conditions: dict[str, str | None]) -> None:
    need(conditions, "page_cache_eviction")
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(16 * MB))  # freshly written: dirty pages, which plain advice would not drop
    assert resident_bytes(path) == 16 * MB
    assert evict_page_cache(tmp_path) == 16 * MB  # a directory is walked
    assert resident_bytes(path) < 256 * 1024
    with path.open("rb") as f:
        f.read(4 * MB)
    assert 4 * MB <= resident_bytes([path]) < 16 * MB  # readahead may bring a little more than was read
    with path.open("rb") as f:
        f.read()
    assert resident_bytes(tmp_path) == 16 * MB
    evict_page_cache([path])
    assert resident_bytes(path) < 256 * 1024


def test_page_cache_helpers_name_a_missing_path(tmp_path: Path) -> None:
    for helper in (resident_bytes, evict_page_cache):
        with pytest.raises(FileNotFoundError, match="nope"):
            helper(tmp_path / "nope")
    (tmp_path / "empty").touch()
    assert resident_bytes(tmp_path / "empty") == 0 and evict_page_cache(tmp_path / "empty") == 0


def test_probe_explains_memory_only_filesystems() -> None:
    probe = probe_storage_conditions("/dev/shm")
    assert set(probe) == {"page_cache_eviction", "memory_limit", "storage_bandwidth"}
    if not Path("/dev/shm").is_dir() or probe["page_cache_eviction"] is None:
        pytest.skip("/dev/shm is not a memory filesystem here")
    assert "tmpfs" in probe["page_cache_eviction"]
    assert "no block device" in probe["storage_bandwidth"]


def test_throttle_on_a_memory_filesystem_is_refused_cleanly() -> None:
    if "tmpfs" not in (probe_storage_conditions("/dev/shm")["storage_bandwidth"] or ""):
        pytest.skip("/dev/shm is not tmpfs here")
    with (
        pytest.raises(StorageConditionUnavailable, match="/dev/shm is on tmpfs"),
        StorageLimits(storage_bandwidth=MB, device_path="/dev/shm"),
    ):
        pass


def _as_unprivileged(call: Callable[[], object]) -> str:
    """repr of what ``call`` returns or raises in a forked child running as uid and gid 65534."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # dropping to a non-zero euid also drops the capabilities
        try:
            os.setegid(65534)
            os.seteuid(65534)
            try:
                out = repr(call())
            except Exception as e:
                out = repr(e)
            os.write(write_end, out.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.mark.multiproc
def test_probe_as_an_unprivileged_user_says_why(conditions: dict[str, str | None]) -> None:
    need(conditions, "memory_limit")
    out = _as_unprivileged(lambda: probe_storage_conditions("/tmp")["memory_limit"])
    assert "cannot create cgroup" in out and "denied" in out


@pytest.mark.multiproc
def test_resident_bytes_refuses_what_the_kernel_would_misreport(shm_dir: Path) -> None:
    shm_dir.chmod(0o755)
    (shm_dir / "f").write_bytes(b"x" * 8192)
    out = _as_unprivileged(lambda: resident_bytes(shm_dir / "f"))
    assert out.startswith("PermissionError") and "only to the owner or a writer" in out, out
    (shm_dir / "f").chmod(0o666)
    assert _as_unprivileged(lambda: resident_bytes(shm_dir / "f")) == "8192"


def test_limits_validate_arguments() -> None:
    with pytest.raises(ValueError, match="memory_limit"):
        StorageLimits(memory_limit=0)
    with pytest.raises(ValueError, match="storage_bandwidth"):
        StorageLimits(storage_bandwidth=-1)
    with pytest.raises(RuntimeError, match="not active"):
        StorageLimits().popen(["true"])


def test_counters_say_why_they_are_missing(conditions: dict[str, str | None]) -> None:
    with pytest.raises(StorageConditionUnavailable, match="never entered"):
        StorageLimits().read_bytes()
    need(conditions, "memory_limit")
    if "tmpfs" not in (probe_storage_conditions("/dev/shm")["storage_bandwidth"] or ""):
        pytest.skip("/dev/shm is not tmpfs here")
    with StorageLimits(memory_limit=64 * MB, device_path="/dev/shm") as limits:
        assert limits.memory_failcnt() == 0
        with pytest.raises(
            StorageConditionUnavailable, match="read_bytes is not counted: /dev/shm is on tmpfs"
        ):
            limits.read_bytes()


@pytest.mark.parametrize(
    ("size", "pages"), [(0, 0), (1, 1), (PAGE - 1, 1), (PAGE, 1), (PAGE + 1, 2), (6_000, 2), (112_000, 28)]
)
def test_device_bytes_are_whole_pages(size: int, pages: int) -> None:
    assert device_bytes(size) == pages * PAGE


def test_data_size_counts_each_file_in_whole_pages(tmp_path: Path) -> None:
    sizes = [6_000, 6_000, PAGE, 1, 0]
    (tmp_path / "class_0").mkdir()
    for i, size in enumerate(sizes):
        (tmp_path / "class_0" / f"img{i}.jpg").write_bytes(b"x" * size)
    assert data_size(tmp_path) == DataSize(device_bytes=6 * PAGE, record_bytes=sum(sizes))
    assert data_size(tmp_path / "class_0" / "img0.jpg") == DataSize(device_bytes=2 * PAGE, record_bytes=6_000)


@pytest.mark.slow
def test_the_kernel_reads_small_files_in_whole_pages(
    tmp_path: Path, conditions: dict[str, str | None]
) -> None:
    """What ``device_bytes`` assumes, checked against the kernel's own count: 6 KB files cost two pages."""
    need(conditions, "storage_bandwidth", "page_cache_eviction")
    for i in range(200):
        _cold_file(tmp_path / f"r{i:03d}.bin", 6_000)
    with StorageLimits(device_path=tmp_path) as limits:
        limits.run(["cat", *sorted(map(str, tmp_path.iterdir()))], stdout=subprocess.DEVNULL, check=True)
    assert (
        data_size(tmp_path).device_bytes <= limits.read_bytes() < data_size(tmp_path).device_bytes + 64 * PAGE
    )


@pytest.mark.slow
def test_read_throttle_and_kernel_byte_count(tmp_path: Path, conditions: dict[str, str | None]) -> None:
    need(conditions, "storage_bandwidth", "page_cache_eviction")
    path = _cold_file(tmp_path / "cold.bin", 64 * MB)
    with StorageLimits(storage_bandwidth=32 * MB, device_path=tmp_path) as limits:
        start = time.perf_counter()
        limits.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
        elapsed = time.perf_counter() - start
        assert 64 * MB <= limits.read_bytes() < 66 * MB
    assert 1.5 < elapsed < 4.0  # 2 s at the throttled rate
    assert 64 * MB <= limits.read_bytes() < 66 * MB  # the count survives the cgroup


@pytest.mark.slow
def test_memory_limit_stops_an_allocation(conditions: dict[str, str | None]) -> None:
    need(conditions, "memory_limit")
    with StorageLimits(memory_limit=64 * MB) as limits:
        done = limits.run(
            [sys.executable, "-c", "b = b'x' * (256 << 20); print(len(b))"], capture_output=True
        )
        assert done.returncode != 0 or limits.memory_failcnt() > 0
        assert limits.memory_max_usage() <= 64 * MB
    assert done.stdout == b""  # it never got its 256 MB


@pytest.mark.multiproc
def test_cleanup_kills_everything_left_in_the_cgroup(conditions: dict[str, str | None]) -> None:
    need(conditions, "memory_limit", "storage_bandwidth")
    script = "trap '' TERM; sleep 300 & echo $!; exec sleep 300"  # an orphan-to-be and a stubborn child
    with StorageLimits(memory_limit=256 * MB, storage_bandwidth=100 * MB) as limits:
        child = limits.popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
        grandchild = int(child.stdout.readline())
        child.stdout.close()
        dirs = limits.paths
        assert all(str(grandchild) in (d / "cgroup.procs").read_text().split() for d in dirs)
    assert child.returncode is not None and _gone(grandchild)
    assert not any(d.exists() for d in dirs)


@pytest.mark.multiproc
@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_cleanup_on_an_exception(conditions: dict[str, str | None], error: type[BaseException]) -> None:
    need(conditions, "memory_limit")
    with pytest.raises(error), StorageLimits(memory_limit=256 * MB) as limits:
        child = limits.popen(["sleep", "300"])
        dirs = limits.paths
        raise error("interrupted")
    assert child.returncode is not None
    assert not any(d.exists() for d in dirs)


@pytest.mark.parametrize("when", ["made", "removed"])
def test_a_stop_while_a_cgroup_is_made_or_removed_leaves_no_cgroup(conditions, monkeypatch, when):
    """SIGTERM (stallbench's stop) right after a cgroup's mkdir, or inside its removal: it acts once the
    cgroup is noted, or gone, and nothing is left."""
    need(conditions, "memory_limit")
    made: list[Path] = []
    making, removing = cgroup._make_cgroup, cgroup.remove_cgroup

    def make_then_stop(controller: str, name: str) -> Path:
        made.append(making(controller, name))
        if when == "made":
            os.kill(os.getpid(), signal.SIGTERM)
        return made[-1]

    def stop_then_remove(path: Path, deadline: float) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        removing(path, deadline)

    monkeypatch.setattr(cgroup, "_make_cgroup", make_then_stop)
    if when == "removed":
        monkeypatch.setattr(cgroup, "remove_cgroup", stop_then_remove)
    with stops_as_ctrl_c(), pytest.raises(Stopped), StorageLimits(memory_limit=256 * MB):
        pass
    assert made and not any(p.exists() for p in made)


def test_resident_bytes_in_whole_pages_counts_the_memory_a_small_file_takes(tmp_path):
    path = tmp_path / "six-k"
    path.write_bytes(b"x" * 6000)
    evict_page_cache(path)
    path.read_bytes()
    if resident_bytes(path) == 0:
        pytest.skip(f"{tmp_path} keeps no page cache the kernel reports")
    assert resident_bytes(path) == 6000
    assert resident_bytes(path, whole_pages=True) == 2 * mmap.PAGESIZE


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 Bytes"),
        (999, "999 Bytes"),
        (112_000, "112.00 kB"),
        (1_234_000_000, "1.23 GB"),
        (float("nan"), "-"),
    ],
)
def test_format_bytes_in_decimal_units(count: float, text: str) -> None:
    assert format_bytes(count) == text


def test_a_dataset_is_sized_one_way_for_every_target_hidden_files_left_out(tmp_path):
    """A generated workload and a user's command size their data by one rule (``dataset_size``): what a
    source reads, so a hidden file (a manifest, .DS_Store) or a hidden folder (.git) does not count."""
    from stallbench.analysis.request import CacheSpec, cache_bytes
    from stallbench.conditions.storage import DataSize, dataset_size

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.jpg").write_bytes(b"x" * 5000)
    (tmp_path / "a" / ".DS_Store").write_bytes(b"x" * 100_000)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "pack").write_bytes(b"x" * 100_000)
    assert dataset_size(tmp_path) == DataSize(device_bytes=PAGE * 2, record_bytes=5000)
    assert dataset_size(tmp_path / "a" / "1.jpg") == dataset_size(tmp_path)
    assert cache_bytes(CacheSpec(0.5), 8192) == 4096 and cache_bytes(3000, 8192) == 3000
    (tmp_path / "a" / "1.jpg").unlink()
    with pytest.raises(ValueError, match=f"--data {tmp_path} holds no file"):
        dataset_size(tmp_path)
