"""What a stallbench run leaves where it is killed with SIGKILL, and its removal.

A run names what it makes after its pid: scratch folders (``stallbench-run-<pid>-*`` in the cache's home or in
/dev/shm, ``stallbench-job-<pid>-*`` and ``sb-<pid>-*`` in the temporary folder) and cgroups
(``stallbench-<pid>-*``). Killed, it removes none of them: its watchdog (``watchdog.py``) removes them once it
has killed the run's jobs, and the next run removes those of any run of this user whose process is gone (a
watchdog killed with its run)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from stallbench.conditions.cgroup import controller_roots, remove_cgroup

__all__ = ["JOB_PREFIX", "JOB_TMP_PREFIX", "RUN_PREFIX", "sweep", "sweep_cgroups", "sweep_folders"]

RUN_PREFIX, JOB_PREFIX, JOB_TMP_PREFIX = "stallbench-run", "stallbench-job", "sb"


def sweep(pid: int | None = None) -> None:
    """Remove what a dead run of this user left: ``pid``'s (its watchdog knows it is dead), or, with None,
    that of every run whose process is gone."""
    for parent, prefix in _homes():
        sweep_folders(parent, prefix, pid)
    sweep_cgroups(pid)


def sweep_folders(parent: Path, prefix: str, pid: int | None = None) -> None:
    """Remove ``<prefix>-<pid>-*`` folders of ``parent`` that this user owns, of ``pid`` or (None) of any
    process that is gone; another user's, a link, a file or a live process's are left alone."""
    for entry in parent.glob(f"{prefix}-{pid if pid is not None else '*'}-*"):
        with contextlib.suppress(ValueError, OSError):
            st = entry.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            owner = int(entry.name[len(prefix) + 1 :].split("-")[0])
            if owner == pid or not _alive(owner):
                shutil.rmtree(entry, ignore_errors=True)


def sweep_cgroups(pid: int | None = None) -> None:
    """Remove the empty cgroups of a stallbench process that died without removing them: ``pid``'s (known
    dead), or (None) every one's whose process is gone and that is over a minute old (one made by a process
    of another pid namespace a moment ago may not hold its process yet)."""
    for path in (path for root in controller_roots() for path in root.glob("stallbench-*-*")):
        with contextlib.suppress(ValueError, OSError):  # gone already, or holds processes: not ours to kill
            owner, st = int(path.name.split("-")[-2]), path.stat()
            if st.st_uid != os.geteuid():
                continue
            if pid is None and not _alive(owner) and time.time() - st.st_mtime > 60:
                path.rmdir()
            elif owner == pid:
                remove_cgroup(path, time.monotonic() + 2)  # its last processes may still be leaving it


def _homes() -> Iterator[tuple[Path, str]]:
    """Where a run makes its folders, with the prefix of each."""
    from loader.system.home import default_cache_dir  # here: the command line starts without torch

    temp = Path(tempfile.gettempdir())
    for parent in dict.fromkeys([Path(default_cache_dir()), Path("/dev/shm")]):
        yield parent, RUN_PREFIX
    for parent in dict.fromkeys([temp, Path("/tmp")]):
        yield parent, JOB_PREFIX
        yield parent, JOB_TMP_PREFIX


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
