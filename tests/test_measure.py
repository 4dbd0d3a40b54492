"""stallbench.analysis.measure: memory and storage bandwidth; and the Machine a report builds from them and
the runs' CPU (``loader_report.measured_machine``)."""

from __future__ import annotations

import os

import pytest
from _data import make_image_folder

from stallbench.analysis.loader_report import measured_machine
from stallbench.analysis.measure import (
    _read_files,
    available_cores,
    measure_bandwidths,
    measure_memory_bandwidth,
    measure_storage_bandwidth,
)
from stallbench.analysis.results import Breakdown, Machine, Workload
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import probe_storage_conditions
from stallbench.conditions.storage import (
    data_size,
    evict_page_cache,
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
    problem = probe_storage_conditions(data_files)["storage_bandwidth"]
    if problem is not None:
        pytest.skip(f"no read throttle here: {problem}")
    limits = StorageLimits(storage_bandwidth=THROTTLE, device_path=data_files)
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
    problem = probe_storage_conditions(small_files)["storage_bandwidth"]
    if problem is not None:
        pytest.fail(f"this test needs a kernel read throttle: {problem}")
    limits = StorageLimits(storage_bandwidth=8_000_000, device_path=small_files)
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


def test_bandwidths_are_storage_then_memory(tmp_path):
    make_image_folder(tmp_path, {"a": 4, "b": 4})
    storage, memory = measure_bandwidths(tmp_path, readers=2)
    assert storage > 0 and memory > 1e8


def _breakdown(**figures: float) -> Breakdown:
    parts = dict(compute_seconds=6.0, prep_stall_seconds=2.0, fetch_stall_seconds=2.0, warmup_seconds=0.0)
    return Breakdown(epoch_seconds=10.0, **parts, **figures)


def _workload(workers: int) -> Workload:
    return Workload("/d", 10**6, 10**6, 1200, 64, workers, "x", 3, None, None, None)


def test_the_prep_rate_is_the_samples_over_the_cpu_prep_took():
    b = _breakdown(warm_epoch_seconds=8.0, step_cpu_seconds=5.0, prep_cpu_seconds=4.0)
    machine = measured_machine(_workload(2), b, 100e6, 5e9)
    assert machine == Machine(available_cores(), 100e6, 5e9, 1200 / 4.0)


def test_without_a_measurable_prep_cpu_the_rate_is_the_warm_epoch_on_the_workers_cores():
    b = _breakdown(warm_epoch_seconds=8.0, step_cpu_seconds=5.0, prep_cpu_seconds=0.0)
    cores = min(2, available_cores())
    assert measured_machine(_workload(2), b, 1.0, 1.0).prep_samples_per_s_per_core == 1200 / (8.0 * cores)
