"""stallbench.analysis.measure: memory and storage bandwidth, prep rate on one core, and their Machine."""

from __future__ import annotations

import os

import pytest
import torch
from _data import make_image_folder

from loader import ImageFolder
from stallbench.analysis.measure import (
    _read_files,
    available_cores,
    measure_machine,
    measure_memory_bandwidth,
    measure_prep_rate,
    measure_storage_bandwidth,
)
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.storage import (
    data_size,
    evict_page_cache,
    probe_storage_conditions,
    resident_bytes,
)

THROTTLE = 32_000_000  # bytes/s


@pytest.fixture
def data_files(tmp_path):
    """48 MB in 400 files of 120 KB on the disk that holds tmp_path, written (so resident) already."""
    for i in range(400):
        (tmp_path / f"record{i:03d}.bin").write_bytes(os.urandom(120_000))
    return tmp_path


def test_memory_bandwidth_is_a_real_figure():
    assert measure_memory_bandwidth(64 << 20) > 1e8


def test_available_cores_is_the_affinity_mask():
    assert available_cores() == len(os.sched_getaffinity(0)) >= 1


@pytest.mark.slow
def test_storage_bandwidth_sees_the_kernel_throttle_and_leaves_the_sample_cold(data_files):
    problem = probe_storage_conditions(data_files)["read_throttle"]
    if problem is not None:
        pytest.skip(f"no read throttle here: {problem}")
    limits = StorageLimits(read_bps=THROTTLE, device_path=data_files)
    throttled = measure_storage_bandwidth(data_files, sample_bytes=64 << 20, limits=limits)
    free = measure_storage_bandwidth(data_files, sample_bytes=64 << 20)
    assert throttled == pytest.approx(THROTTLE, rel=0.25)
    assert free > 2 * THROTTLE
    assert resident_bytes(data_files) == 0
    assert limits.paths == []  # entered for the measurement and removed again


@pytest.fixture
def small_files(tmp_path):
    """1,000 files of 6,000 bytes (6 MB): 8,192 bytes each on the device, 8.19 MB in all."""
    for i in range(1000):
        (tmp_path / f"small{i:04d}.bin").write_bytes(os.urandom(6_000))
    return tmp_path


def test_the_reader_counts_the_kernel_bytes_beside_the_file_bytes(small_files):
    files = sorted(map(str, small_files.iterdir()))
    evict_page_cache(files)
    for readers in (1, 3):
        result = _read_files(files, readers, None)
        evict_page_cache(files)
        assert result["record_bytes"] == 6_000_000
        assert 8_192_000 <= result["device_bytes"] < 8_192_000 + 64 * 4096  # whole pages, as jobs count them


@pytest.mark.slow
def test_storage_bandwidth_of_small_files_is_in_device_bytes(small_files):
    """A throttle limits device bytes: a 6 KB file reads 8 KB, its own bytes flow at 0.73 x the throttle."""
    problem = probe_storage_conditions(small_files)["read_throttle"]
    if problem is not None:
        pytest.fail(f"this test needs a kernel read throttle: {problem}")
    limits = StorageLimits(read_bps=8_000_000, device_path=small_files)
    bandwidth = measure_storage_bandwidth(small_files, sample_bytes=6_000_000, limits=limits, readers=2)
    assert 0.9 * 8e6 < bandwidth < 1.25 * 8e6  # the throttle, plus the cgroup's first slice of burst
    assert data_size(small_files).device_bytes == 8_192_000


def test_storage_bandwidth_reads_only_a_sample(data_files):
    # the whole folder is resident after writing; a 1 MB sample is evicted (9 files), the rest stays
    measure_storage_bandwidth(data_files, sample_bytes=1 << 20)
    assert 0 < 48_000_000 - resident_bytes(data_files) <= 9 * 120_000


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_storage_bandwidth_refuses_a_bad_sample_size(data_files, bad):
    with pytest.raises(ValueError, match="sample_bytes must be a positive int"):
        measure_storage_bandwidth(data_files, sample_bytes=bad)


@pytest.mark.parametrize("bad", [0, -2, 1.0])
def test_storage_bandwidth_refuses_a_bad_reader_count(data_files, bad):
    with pytest.raises(ValueError, match="readers must be a positive int"):
        measure_storage_bandwidth(data_files, readers=bad)


def test_storage_bandwidth_needs_bytes(tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="no bytes to read"):
        measure_storage_bandwidth(tmp_path)


class _Probe:
    """A dataset that records the affinity and torch threads it runs with, and can fail."""

    def __init__(self, size: int, fail: bool = False) -> None:
        self.size, self.fail, self.seen = size, fail, set()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        if self.fail:
            raise RuntimeError(f"bad record {index}")
        self.seen.add((len(os.sched_getaffinity(0)), torch.get_num_threads()))
        return index


def test_prep_rate_of_a_real_image_folder(tmp_path):
    make_image_folder(tmp_path, {"cat": 6, "dog": 6})
    assert measure_prep_rate(ImageFolder(str(tmp_path), transform="train"), seconds=0.2) > 0


@pytest.mark.parametrize("fail", [False, True])
def test_prep_rate_runs_on_one_core_and_one_thread_then_restores_both(fail):
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    probe = _Probe(50, fail=fail)
    if fail:
        with pytest.raises(RuntimeError, match="bad record"):
            measure_prep_rate(probe, seconds=0.1)
    else:
        assert measure_prep_rate(probe, seconds=0.1) > 0
        assert probe.seen == {(1, 1)}
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == (cores, threads)


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"seconds": 0}, "seconds"), ({"max_samples": 0}, "max_samples")]
)
def test_prep_rate_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        measure_prep_rate(_Probe(5), **kwargs)


def test_prep_rate_refuses_an_empty_dataset():
    with pytest.raises(ValueError, match="empty"):
        measure_prep_rate(_Probe(0))


def test_machine_holds_the_four_measured_figures(tmp_path):
    make_image_folder(tmp_path, {"a": 4, "b": 4})
    machine = measure_machine(ImageFolder(str(tmp_path)), tmp_path)
    assert machine.cores == available_cores()
    assert machine.storage_bytes_per_s > 0 and machine.memory_bytes_per_s > 1e8
    assert machine.prep_samples_per_s_per_core > 0
