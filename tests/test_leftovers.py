"""What a stallbench run killed with SIGKILL leaves, and who removes it: the run's watchdog at once, or (the
watchdog killed too) the next run, this user's leftovers of dead processes only (issue 46)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from stallbench.jobs import leftovers

CGROUPS = [Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/blkio")]
NOBODY = 65534


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


@pytest.fixture
def homes(tmp_path, monkeypatch) -> dict[str, Path]:
    """The cache's home and the temporary folder, each a folder of this test's."""
    cache, temp = tmp_path / "cache", tmp_path / "temp"
    cache.mkdir()
    temp.mkdir()
    monkeypatch.setenv("STALLBENCH_CACHE_DIR", str(cache))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return {"cache": cache, "temp": temp}


def made(parent: Path, name: str, owner: int | None = None) -> Path:
    folder = parent / name
    folder.mkdir()
    (folder / "inside").write_bytes(b"x")
    if owner is not None:
        os.chown(folder, owner, owner)
    return folder


def test_the_next_run_removes_a_dead_runs_folders_and_nothing_else(homes):
    dead, live = dead_pid(), os.getpid()
    gone = [
        made(homes["cache"], f"stallbench-run-{dead}-a1"),
        made(homes["temp"], f"stallbench-job-{dead}-b2"),
        made(homes["temp"], f"sb-{dead}-c3"),
    ]
    kept = [
        made(homes["cache"], f"stallbench-run-{live}-d4"),  # a live run's
        made(homes["temp"], f"sb-{live}-e5"),
        made(homes["temp"], "sb-notapid-f6"),  # not a name of ours
        made(homes["temp"], f"unrelated-{dead}-g7"),
    ]
    if os.geteuid() == 0:
        kept.append(made(homes["temp"], f"stallbench-job-{dead}-h8", owner=NOBODY))  # another user's
    link = homes["cache"] / f"stallbench-run-{dead}-link"
    link.symlink_to(kept[0])  # a link is never followed nor removed
    leftovers.sweep()
    assert not [folder for folder in gone if folder.exists()]
    assert all((folder / "inside").exists() for folder in kept) and link.is_symlink()


@pytest.mark.skipif(not all(root.is_dir() for root in CGROUPS), reason="needs cgroup v1 memory and blkio")
def test_a_dead_runs_empty_cgroups_go_once_a_minute_old_or_when_its_watchdog_names_it(homes):
    if os.geteuid() != 0:
        pytest.skip("making cgroups needs root")
    dead = dead_pid()
    old, fresh = (
        [root / f"stallbench-{dead}-{n}" for root in CGROUPS] for n in (0, 1)
    )  # a fresh one may belong to a process of another pid namespace, not yet inside it
    mine = [root / f"stallbench-{os.getpid()}-7" for root in CGROUPS]
    try:
        for path in old + fresh + mine:
            path.mkdir()
        for path in old:
            os.utime(path, (time.time() - 120, time.time() - 120))
        leftovers.sweep()
        assert not any(path.exists() for path in old)
        assert all(path.exists() for path in fresh + mine)
        leftovers.sweep(dead)  # its watchdog: the run is known dead
        assert not any(path.exists() for path in fresh) and all(path.exists() for path in mine)
    finally:
        for path in old + fresh + mine:
            if path.exists():
                path.rmdir()
