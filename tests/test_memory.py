"""The memory view: cgroup v1 and v2 trees faked under tmp_path, then one real cgroup v1 limit."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from loader.system import headroom as _headroom
from loader.system import memory as _memory
from loader.system import sizing as _sizing
from loader.system.headroom import PressureGauge
from loader.system.memory import MemoryView, memory_view
from loader.system.sizing import (
    auto_cache_bytes,
    disk_room,
    reserve_bytes,
    reserve_for_limit,
    sized_cache_bytes,
)
from stallbench.conditions.cgroup import StorageLimits
from stallbench.conditions.limits import probe_storage_conditions
from stallbench.conditions.storage import evict_page_cache

MIB, GIB = 1 << 20, 1 << 30
V1_NO_LIMIT = 9223372036854771712
MACHINE = "the machine's MemAvailable"


class FakeMachine:
    """/proc/self/cgroup, /proc/self/mountinfo, /proc/meminfo and one memory cgroup tree, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mount = root / "cgroup"
        self.meminfo(available=20 * GIB, total=32 * GIB)

    def meminfo(self, available: int, total: int) -> None:
        lines = (f"MemTotal: {total >> 10} kB", "MemFree: 1024 kB", f"MemAvailable: {available >> 10} kB")
        (self.root / "meminfo").write_text("\n".join(lines) + "\n")

    def join(self, version: str, path: str, mount_root: str = "/") -> None:
        """Make this process a member of ``path`` in a ``version`` hierarchy mounted from ``mount_root``."""
        membership = "4:memory:{}\n0::/\n" if version == "v1" else "0::{}\n"
        (self.root / "cgroup_of_self").write_text(membership.format(path))
        fstype = "cgroup cgroup rw,memory" if version == "v1" else "cgroup2 cgroup2 rw"
        mount = f"35 31 0:32 {mount_root} {self.mount} rw,relatime - {fstype}\n"
        (self.root / "mountinfo").write_text("30 1 8:1 / / rw - ext4 /dev/vda rw\n" + mount)

    def v1(self, rel: str, limit: int = V1_NO_LIMIT, anon: int = 0, shmem: int = 0, cache: int = 0) -> None:
        """A v1 cgroup whose usage is ``anon + shmem + cache``; ``cache`` is the file cache, reclaimable."""
        stat = {
            "cache": shmem + cache,
            "shmem": shmem,
            "active_file": 7 * GIB,  # this level's own pages only: a reader that takes these is wrong
            "inactive_file": 7 * GIB,
            "total_shmem": shmem,
            "total_active_file": cache - cache // 3,
            "total_inactive_file": cache // 3,
        }
        self._write(
            rel, {"memory.limit_in_bytes": limit, "memory.usage_in_bytes": anon + shmem + cache}, stat
        )

    def v2(
        self,
        rel: str,
        limit: int | None = None,
        anon: int = 0,
        shmem: int = 0,
        cache: int = 0,
        high: int | None = None,
    ) -> None:
        """A v2 cgroup; ``None`` limits are written "max"."""
        stat = {"anon": anon, "file": shmem + cache, "shmem": shmem}
        stat |= {"active_file": cache // 2, "inactive_file": cache - cache // 2}
        files = {"memory.max": limit, "memory.high": high, "memory.current": anon + shmem + cache}
        self._write(rel, {k: "max" if v is None else v for k, v in files.items()}, stat)

    def _write(self, rel: str, files: dict[str, int | str], stat: dict[str, int]) -> None:
        directory = self.mount / rel
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            (directory / name).write_text(f"{value}\n")
        (directory / "memory.stat").write_text("".join(f"{k} {v}\n" for k, v in stat.items()))


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMachine]:
    machine = FakeMachine(tmp_path)
    for constant, name in (
        ("_PROC_CGROUP", "cgroup_of_self"),
        ("_MOUNTINFO", "mountinfo"),
        ("_MEMINFO", "meminfo"),
    ):
        monkeypatch.setattr(_memory, constant, str(tmp_path / name))
    _memory._hierarchy.cache_clear()
    yield machine
    _memory._hierarchy.cache_clear()


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize(
    ("anon", "shmem", "cache"),
    [(0, 0, 0), (500 * MIB, 0, 0), (0, 700 * MIB, 0), (0, 0, 1800 * MIB), (200 * MIB, 300 * MIB, 1200 * MIB)],
)
def test_headroom_counts_anon_and_shmem_but_not_the_file_cache(fake, version, anon, shmem, cache):
    fake.join(version, "/job/x")
    getattr(fake, version)("job/x", limit=2 * GIB, anon=anon, shmem=shmem, cache=cache)
    assert memory_view() == MemoryView(
        2 * GIB - anon - shmem, 2 * GIB, f"the cgroup {version} memory limit of /job/x (2.0 GiB)"
    )


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_an_ancestor_with_less_headroom_binds(fake, version):
    fake.join(version, "/job/x")
    add = getattr(fake, version)
    add("", cache=GIB)
    add("job", limit=3 * GIB, anon=2 * GIB, cache=512 * MIB)  # its other children use most of it
    add("job/x", limit=4 * GIB, anon=GIB)
    assert memory_view() == MemoryView(GIB, 3 * GIB, f"the cgroup {version} memory limit of /job (3.0 GiB)")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_without_a_cgroup_limit_the_machine_memavailable_counts(fake, version):
    fake.join(version, "/job/x")
    getattr(fake, version)("job/x", anon=GIB)
    getattr(fake, version)("job", anon=2 * GIB)
    fake.meminfo(available=5 * GIB, total=16 * GIB)
    assert memory_view() == MemoryView(5 * GIB, 16 * GIB, MACHINE)


def test_the_machine_binds_when_it_has_less_than_the_cgroup(fake):
    fake.join("v1", "/job")
    fake.v1("job", limit=8 * GIB, anon=GIB)
    fake.meminfo(available=3 * GIB, total=16 * GIB)
    assert memory_view() == MemoryView(3 * GIB, 16 * GIB, MACHINE)


def test_v2_memory_high_binds_below_memory_max_and_the_root_has_no_limit_files(fake):
    fake.join("v2", "/job")
    fake.v2("job", limit=4 * GIB, high=3 * GIB, anon=GIB, cache=GIB)
    (fake.mount / "memory.stat").write_text("anon 0\n")  # the v2 root: memory.stat but no memory.max
    assert memory_view() == MemoryView(2 * GIB, 3 * GIB, "the cgroup v2 memory limit of /job (3.0 GiB)")
    assert [level.name for level in _memory._hierarchy()] == ["/job"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_usage_over_the_limit_leaves_no_headroom(fake, version):
    fake.join(version, "/job")
    getattr(fake, version)("job", limit=GIB, anon=GIB + 10 * MIB)
    assert memory_view().headroom == 0


@pytest.mark.parametrize(
    ("mount_root", "member_of", "binding"),
    [
        ("/", "/job/x", "/job/x"),
        ("/job", "/job/x", "/job/x"),  # a container sees its part of the host's hierarchy
        ("/job/x", "/", "/job/x"),  # a cgroup namespace: its own cgroup is "/" to the job
        ("/", "/../elsewhere", "/"),  # a path outside the mount: the mount itself is what the job has
    ],
)
def test_cgroup_paths_are_found_under_the_mount_root(fake, mount_root, member_of, binding):
    fake.join("v1", member_of, mount_root)
    rel = os.path.relpath(binding, mount_root) if binding != mount_root else ""
    fake.v1(rel, limit=GIB, anon=100 * MIB)
    if rel:
        fake.v1("", limit=V1_NO_LIMIT)
    assert memory_view() == MemoryView(924 * MIB, GIB, f"the cgroup v1 memory limit of {binding} (1.0 GiB)")


def _remove(*names: str):
    def remove(machine: FakeMachine) -> None:
        for name in names:
            (machine.root / name).unlink()

    return remove


def _garble(machine: FakeMachine) -> None:
    (machine.mount / "job" / "memory.limit_in_bytes").write_text("a lot\n")


@pytest.mark.parametrize(
    "damage",
    [
        _remove("cgroup_of_self"),
        _remove("mountinfo"),
        _remove("cgroup/job/memory.usage_in_bytes"),  # gone after the files were found
        _remove("cgroup/job/memory.stat"),
        _garble,
    ],
)
def test_unreadable_cgroup_files_leave_the_machine_memavailable(fake, damage):
    fake.join("v1", "/job")
    fake.v1("job", limit=GIB, anon=100 * MIB)
    fake.meminfo(available=5 * GIB, total=16 * GIB)
    assert memory_view().source != MACHINE  # the files were found and bind
    damage(fake)
    _memory._hierarchy.cache_clear()
    assert memory_view() == MemoryView(5 * GIB, 16 * GIB, MACHINE)


def test_a_hybrid_machine_without_a_v1_memory_mount_uses_no_cgroup(fake):
    fake.join("v1", "/job")
    (fake.root / "mountinfo").write_text(f"35 31 0:32 / {fake.mount} rw - cgroup2 cgroup2 rw\n")
    fake.mount.mkdir()  # the unified hierarchy, without the memory controller's files
    assert memory_view().source == MACHINE
    assert _memory._hierarchy() == ()


def test_without_proc_meminfo_psutil_tells(fake):
    (fake.root / "meminfo").unlink()
    view = memory_view()
    assert view.limit == psutil.virtual_memory().total
    assert 0 < view.headroom <= view.limit and view.source == MACHINE


@pytest.mark.parametrize(
    ("limit", "own", "reserve"),
    [
        (0, 0, 16 * MIB),  # a fifth of the job, at least 16 MiB
        (375 * MIB, 290 * MIB, 58 * MIB),  # a fifth of a small job under a tight limit
        (GIB, 900 * MIB, 128 * MIB),  # at most 128 MiB
        (100 * GIB, 10 * GIB, 5 * GIB),  # 5% of a big limit
    ],
)
def test_reserve_scales_with_the_limit_and_the_job_s_own_memory(limit, own, reserve):
    assert reserve_for_limit(limit, own) == reserve
    assert reserve_bytes(MemoryView(limit - own, limit, MACHINE)) == reserve


@pytest.mark.parametrize(
    ("wanted", "headroom", "chosen", "why"),
    [
        (1288 * MIB, 5427 * MIB, 1288 * MIB, "1.3 GiB: the dataset's size, within 5.3 GiB free per SRC"),
        (10 * GIB, 364 * MIB, 236 * MIB, "236.0 MiB: 364.0 MiB free per SRC, less 128.0 MiB kept free"),
        (10 * GIB, 50 * MIB, 0, "0 Bytes: 50.0 MiB free per SRC, less 128.0 MiB kept free"),
        (10 * GIB, 0, 0, "0 Bytes: 0 Bytes free per SRC, less 128.0 MiB kept free"),
        (0, 2 * GIB, 0, "0 Bytes: the dataset's size, within 2.0 GiB free per SRC"),
    ],
)
def test_auto_cache_bytes_takes_the_dataset_within_headroom_less_the_reserve(wanted, headroom, chosen, why):
    assert auto_cache_bytes(wanted, MemoryView(headroom, 2 * GIB, "SRC")) == (chosen, why)


def test_auto_cache_bytes_never_exceeds_wanted_nor_headroom_less_reserve():
    sizes = [0, 1, 63 * MIB, 64 * MIB, 64 * MIB + 1, 700 * MIB, 3 * GIB, 50 * GIB]
    for limit in (GIB, 64 * GIB):
        for headroom in sizes:
            view = MemoryView(headroom, limit, MACHINE)
            for wanted in sizes:
                chosen, _ = auto_cache_bytes(wanted, view)
                assert chosen == max(0, min(wanted, headroom - reserve_bytes(view)))


def test_auto_cache_bytes_reads_the_memory_view_when_given_none(fake):
    fake.meminfo(available=GIB, total=2 * GIB)
    assert auto_cache_bytes(10 * GIB) == (
        GIB - 128 * MIB,
        f"896.0 MiB: 1.0 GiB free per {MACHINE}, less 128.0 MiB kept free",
    )


@pytest.mark.parametrize("wanted", [-1, 1.5, True, "1G"])
def test_auto_cache_bytes_rejects_what_is_not_a_size(wanted):
    with pytest.raises(ValueError, match="wanted must be a non-negative int"):
        auto_cache_bytes(wanted)


LIMIT = 2560 * MIB


class Views:
    """A stand-in for memory_view() and the gauge's clock: counts reads; the limit is 2.5 GiB, so that what
    the cache keeps free is 128 MiB (5% of it) whatever the headroom."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, headroom: int, limit: int = LIMIT) -> None:
        self.headroom, self.limit, self.reads, self.now = headroom, limit, 0, 1000.0
        monkeypatch.setattr(_memory, "memory_view", self.view)
        monkeypatch.setattr(_headroom, "monotonic", lambda: self.now)

    kernel = 0

    def view(self) -> MemoryView:
        self.reads += 1
        return MemoryView(self.headroom, self.limit, "SRC", self.kernel)


def test_gauge_rereads_once_the_interval_passed(monkeypatch):
    views = Views(monkeypatch, GIB)
    gauge = PressureGauge(interval=1.0, bytes_between=GIB)
    assert not gauge.short() and views.reads == 1 and gauge.last == MemoryView(GIB, LIMIT, "SRC")
    views.now += 0.99
    views.headroom = 0
    assert not gauge.short() and views.reads == 1
    views.now += 0.01
    assert gauge.short() and views.reads == 2 and gauge.last.headroom == 0


@pytest.mark.parametrize(("bytes_between", "step"), [(100 * MIB, 30 * MIB), (None, 4 * MIB)])
def test_gauge_rereads_after_bytes_between_were_noted(monkeypatch, bytes_between, step):
    views = Views(monkeypatch, GIB)
    gauge = PressureGauge(interval=3600, bytes_between=bytes_between)  # default: 128 MiB // 8 = 16 MiB
    gauge.short()
    for _ in range(3):
        assert not gauge.short(step)
    assert views.reads == 1
    assert not gauge.short(step)  # 4 steps reach bytes_between
    assert views.reads == 2


def test_gauge_is_short_when_adding_would_leave_less_than_the_reserve(monkeypatch):
    Views(monkeypatch, 164 * MIB)
    assert not PressureGauge().short(36 * MIB)
    assert PressureGauge().short(36 * MIB + 1)


def test_gauge_counts_bytes_it_allowed_until_the_next_read(monkeypatch):
    views = Views(monkeypatch, 164 * MIB)
    gauge = PressureGauge(interval=3600, bytes_between=GIB)
    assert not gauge.short(20 * MIB)
    assert gauge.short(20 * MIB)  # 164 - 20 - 20 < 128, though the last view still says 164 free
    assert not gauge.short(16 * MIB)  # what was refused is not counted
    assert views.reads == 1


@pytest.mark.parametrize(
    ("headroom", "overdrawn"), [(100 * MIB, 0), (16 * MIB, 0), (16 * MIB - 1, 16 * MIB + 1), (0, 32 * MIB)]
)
def test_gauge_is_overdrawn_when_the_job_came_within_16_mib_of_its_limit(monkeypatch, headroom, overdrawn):
    Views(monkeypatch, headroom)
    assert PressureGauge().overdrawn() == overdrawn  # what brings the headroom back to 32 MiB


@pytest.mark.parametrize(("headroom", "overdrawn"), [(8 * MIB, 0), (8 * MIB - 1, 8 * MIB + 1)])
def test_gauge_under_a_small_reserve_is_overdrawn_within_half_of_it(monkeypatch, headroom, overdrawn):
    Views(monkeypatch, headroom, limit=80 * MIB)  # a job of ~72 MiB: 16 MiB kept free
    gauge = PressureGauge()
    assert gauge.overdrawn() == overdrawn and gauge.reserve == 16 * MIB


def test_gauge_reads_for_overdrawn_only_once_the_interval_passed_or_when_told_to_forget(monkeypatch):
    views = Views(monkeypatch, 400 * MIB)
    gauge = PressureGauge(interval=1.0)
    held = 300 * MIB
    assert gauge.overdrawn(lambda: held) == 0 and views.reads == 1
    views.headroom = 0  # the job grew by 400 MiB
    assert gauge.overdrawn(lambda: held) == 0 and views.reads == 1
    views.now += 1.0
    assert gauge.overdrawn(lambda: held) == 32 * MIB and views.reads == 2
    views.headroom, held = 32 * MIB, 268 * MIB  # the cache gave 32 MiB back
    gauge.forget()
    assert gauge.last is not None  # another thread may be warning with it
    assert gauge.overdrawn(lambda: held) == 0 and views.reads == 3


@pytest.mark.parametrize(("headroom", "shortfall"), [(200 * MIB, 0), (128 * MIB, 0), (100 * MIB, 28 * MIB)])
def test_gauge_shortfall_is_what_keeps_the_reserve_from_being_free_read_now(monkeypatch, headroom, shortfall):
    views = Views(monkeypatch, GIB)
    gauge = PressureGauge(interval=3600)
    gauge.short()
    views.headroom = headroom  # not due for a read: shortfall reads anyway
    assert gauge.shortfall() == shortfall and views.reads == 2


@pytest.mark.parametrize(
    ("headroom", "growth", "shortfall"),
    [(200 * MIB, 140 * MIB, 0), (100 * MIB, 140 * MIB, 56 * MIB), (100 * MIB, 20 * MIB, 28 * MIB)],
)
def test_gauge_shortfall_makes_room_for_the_growth_expected_and_the_margin_beyond(
    monkeypatch, headroom, growth, shortfall
):
    Views(monkeypatch, headroom, limit=GIB)  # 128 MiB kept free (the job's fifth, at most): margin 16 MiB
    assert PressureGauge().shortfall(growth=growth) == shortfall  # the larger of the reserve and growth + 16


def test_gauge_within_the_reserve_looks_for_overdrawn_five_times_as_often(monkeypatch):
    views = Views(monkeypatch, GIB)
    gauge = PressureGauge(interval=1.0)
    assert gauge.overdrawn() == 0 and views.reads == 1
    views.now += 0.2
    assert gauge.overdrawn() == 0 and views.reads == 1  # the reserve free: every second
    views.now += 0.8
    views.headroom = 100 * MIB  # within the 128 MiB reserve, not yet within 16 MiB of the limit
    assert gauge.overdrawn() == 0 and views.reads == 2
    views.headroom = 0
    views.now += 0.19
    assert gauge.overdrawn() == 0 and views.reads == 2
    views.now += 0.02  # past a fifth of the interval
    assert gauge.overdrawn() == 32 * MIB and views.reads == 3


def test_gauge_keeps_the_job_s_peak_free_after_it_passed(monkeypatch):
    views = Views(monkeypatch, 500 * MIB)
    gauge = PressureGauge(interval=0)
    assert not gauge.short(300 * MIB)
    views.headroom = 400 * MIB  # a peak of the job's own memory, 100 MiB over its use before and after
    gauge.short()
    views.headroom = 500 * MIB
    assert gauge.short(272 * MIB + 1) and not gauge.short(272 * MIB)  # 500 - 100 - 272 = the 128 MiB reserve
    assert gauge.spare == 400 * MIB


def test_gauge_of_a_store_on_disk_takes_its_page_cache_from_the_headroom(monkeypatch):
    Views(monkeypatch, 500 * MIB)  # the store's 200 MiB of page cache counted in the headroom
    gauge = PressureGauge(interval=0, held_in_memory=False)
    held = 200 * MIB
    assert not gauge.short(172 * MIB, lambda: held) and gauge.short(172 * MIB + 1, lambda: held, note=False)
    assert gauge.spare == 300 * MIB and gauge.own_peak == LIMIT - 500 * MIB  # its own: not the store's
    in_memory = PressureGauge(interval=0)  # the same reading, a store in a tmpfs: usage counts its 200 MiB
    assert not in_memory.short(372 * MIB, lambda: held) and in_memory.own_peak == LIMIT - 700 * MIB


@pytest.mark.parametrize(
    ("kernel", "not_the_job_s"), [(40 * MIB, 200 * MIB * 104 // 4096), (3 * MIB, 3 * MIB), (0, 0)]
)
def test_gauge_of_a_store_on_disk_takes_its_pages_buffer_heads_off_the_job_s_own(
    monkeypatch, kernel, not_the_job_s
):
    """ext4's buffer heads of the store's written pages (104 bytes a 4 KiB page: 5.1 MiB for 200 MiB held) are
    the kernel's, freed with the pages: not the job's own, up to the kernel memory the cgroup reports."""
    views = Views(monkeypatch, 500 * MIB)
    views.kernel = kernel
    gauge = PressureGauge(interval=0, held_in_memory=False)
    gauge.short(0, lambda: 200 * MIB)
    assert gauge.own_peak == LIMIT - 500 * MIB - not_the_job_s
    in_memory = PressureGauge(interval=0)  # a store in a tmpfs: no buffer heads; its pages are the usage's
    in_memory.short(0, lambda: 200 * MIB)
    assert in_memory.own_peak == LIMIT - 700 * MIB


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_view_reports_the_kernel_memory_the_cgroup_is_charged_for(fake, version):
    fake.join(version, "/job")
    getattr(fake, version)("job", limit=2 * GIB, anon=GIB)
    directory = fake.mount / "job"
    if version == "v1":
        (directory / "memory.kmem.usage_in_bytes").write_text(f"{30 * MIB}\n")
    else:
        with (directory / "memory.stat").open("a") as stat:
            stat.write(f"slab_unreclaimable {MIB}\nslab_reclaimable {30 * MIB}\n")
    assert memory_view().kernel == 30 * MIB


def test_gauge_of_a_store_on_disk_gives_back_once_the_job_s_own_memory_leaves_too_little(monkeypatch):
    views = Views(monkeypatch, 200 * MIB)
    gauge = PressureGauge(held_in_memory=False)
    assert gauge.overdrawn(lambda: 190 * MIB) == 2 * 16 * MIB - 10 * MIB  # 10 MiB spare past the store
    views.now += 1
    assert gauge.overdrawn(lambda: 100 * MIB) == 0


def test_sized_cache_bytes_keeps_a_size_the_job_can_spare_and_says_nothing(tmp_path):
    view = MemoryView(GIB, 2 * GIB, "SRC")
    assert sized_cache_bytes(100 * MIB, 100 * MIB, tmp_path, view) == (100 * MIB, "")
    assert sized_cache_bytes("auto", 100 * MIB, tmp_path, view) == (
        100 * MIB,
        "100.0 MiB: the dataset's size, within 1.0 GiB free per SRC",
    )


def test_sized_cache_bytes_lowers_a_size_larger_than_the_job_can_spare_with_one_warning(tmp_path):
    view = MemoryView(GIB, 2 * GIB, "SRC")
    said = "cache_bytes=4294967296 (4.0 GiB) lowered to 896.0 MiB: "
    said += "1.0 GiB free per SRC, less 128.0 MiB kept free"
    with pytest.warns(RuntimeWarning) as caught:
        assert sized_cache_bytes(4 * GIB, 4 * GIB, tmp_path, view) == (GIB - 128 * MIB, said)
    assert [str(w.message) for w in caught] == [f"{said}: the cache holds no more than the job can spare"]


def test_a_cache_leaves_its_filesystem_room(tmp_path, monkeypatch):
    fs = os.statvfs(tmp_path)
    assert 0 <= disk_room(tmp_path) <= fs.f_bavail * fs.f_frsize
    monkeypatch.setattr(_sizing, "disk_room", lambda path: 10 * MIB)
    chosen, why = auto_cache_bytes(GIB, MemoryView(4 * GIB, 8 * GIB, "SRC"), tmp_path)
    assert chosen == 10 * MIB and why == f"10.0 MiB: the space free in {tmp_path}, less 1.0 GiB"
    assert disk_room(tmp_path / "not there") == 1 << 62


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"interval": -1}, "interval"), ({"bytes_between": 0}, "bytes")]
)
def test_gauge_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PressureGauge(**kwargs)


def _meminfo_kb(key: str) -> int:
    return int(re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)[1]) << 10


def test_this_machine_has_headroom_within_its_memavailable():
    view = memory_view()
    assert 0 < view.headroom <= _meminfo_kb("MemAvailable") + 256 * MIB  # memory moves between the reads
    assert view.headroom <= view.limit
    assert view.source != MACHINE or view.limit == _meminfo_kb("MemTotal")


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


@pytest.mark.multiproc
def test_a_fork_finds_its_cgroup_again():
    code = (
        "import os\nfrom loader.system import memory as _memory\n_memory.memory_view()\n"
        "if (pid := os.fork()) == 0:\n"
        "    os._exit(10 + _memory._hierarchy.cache_info().currsize)\n"
        "print(_memory._hierarchy.cache_info().currsize, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_child_env())
    assert done.stdout.split() == ["1", "10"], done.stderr


CHILD = """
import dataclasses, json, sys
from loader.system.memory import memory_view

shm_file, disk_file = sys.argv[1:]
views = [memory_view()]
with open(shm_file, "wb") as f:
    for _ in range(100):
        f.write(b"x" * (1 << 20))
views.append(memory_view())
buffer = bytearray(1 << 20)
with open(disk_file, "rb", buffering=0) as f:
    while f.readinto(buffer):
        pass
views.append(memory_view())
print(json.dumps([dataclasses.asdict(v) for v in views]))
"""


@pytest.fixture(scope="module")
def in_a_cgroup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[MemoryView], str, int]]:
    """Views a child in a fresh 512 MiB memory cgroup took: at its start, after writing 100 MiB to /dev/shm,
    after reading a 100 MiB file from disk; the cgroup's name and its peak usage."""
    scratch = tmp_path_factory.mktemp("memory")
    problems = probe_storage_conditions(scratch)
    if problems["memory_limit"] or problems["page_cache_eviction"]:
        pytest.skip(f"needs a writable cgroup v1 memory controller: {problems}")
    disk_file = scratch / "data"
    disk_file.write_bytes(os.urandom(100 * MIB))
    evict_page_cache(disk_file)  # so that the child's read charges the page cache to its cgroup
    shm = Path("/dev/shm") / f"sbtest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    shm.mkdir(mode=0o700)
    try:
        with StorageLimits(memory_limit=512 * MIB) as limits:
            argv = [sys.executable, "-c", CHILD, str(shm / "cache"), str(disk_file)]
            done = limits.run(argv, capture_output=True, text=True, timeout=120, env=_child_env())
            assert done.returncode == 0, done.stderr
            name = next(p.name for p in limits.paths if p.parent.name == "memory")
            yield [MemoryView(**v) for v in json.loads(done.stdout)], name, limits.memory_max_usage()
    finally:
        shutil.rmtree(shm)


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_real_cgroup_v1_limit_binds(in_a_cgroup):
    (start, *_), name, _ = in_a_cgroup
    assert start.limit == 512 * MIB
    assert 0 < start.headroom <= 512 * MIB
    assert start.source == f"the cgroup v1 memory limit of /{name} (512.0 MiB)"


@pytest.mark.slow
@pytest.mark.multiproc
def test_shmem_takes_headroom_and_the_page_cache_does_not(in_a_cgroup):
    (start, after_shm, after_read), _, peak = in_a_cgroup
    assert peak >= 200 * MIB + (512 * MIB - start.headroom)  # both the shm and the page cache were charged
    assert abs(start.headroom - after_shm.headroom - 100 * MIB) < 8 * MIB
    assert abs(after_shm.headroom - after_read.headroom) < 8 * MIB
