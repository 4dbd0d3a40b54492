"""Shared fixtures: a private cache folder in /dev/shm, and a check that tests leave nothing in /dev/shm."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

SHM = Path("/dev/shm")
_WATCHED = ("stallbench-", "sbtest-", "torch_", "pym-")


def _shm_entries() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith(_WATCHED)} if SHM.is_dir() else set()


@pytest.fixture
def shm_dir():
    """A fresh folder in /dev/shm for caches; removed after the test."""
    path = SHM / f"sbtest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_shm_leak(request):
    """Fails a multi-process test that leaves shared memory behind."""
    if request.node.get_closest_marker("multiproc") is None:
        yield
        return
    before = _shm_entries()
    yield
    leaked = {n for n in _shm_entries() - before if not n.startswith("sbtest-")}
    assert not leaked, f"left in /dev/shm: {sorted(leaked)}"
