"""A job's session killed whole takes with it the shared memory torch named after its processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from stallbench.jobs._session import remove_torch_segments, session

pytestmark = pytest.mark.multiproc
SHM = Path("/dev/shm")

# a job and its worker, each killed with a segment named as torch names them and not yet unlinked
JOB = """
import os, subprocess, sys, time
open(f"/dev/shm/torch_{os.getpid()}_1_0", "wb").close()
child = ("import os, time; open(f'/dev/shm/torch_{os.getpid()}_1_0', 'wb').close(); "
         "print(os.getpid(), flush=True); time.sleep(60)")
worker = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
print(os.getpid(), worker.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


def test_a_killed_session_leaves_no_torch_segment_of_its_processes():
    with session([sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True) as proc:
        pids = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(pids) == 2 and all((SHM / f"torch_{pid}_1_0").exists() for pid in pids)
    assert not any((SHM / f"torch_{pid}_1_0").exists() for pid in pids)


# a job forking a process every 2 ms, each naming a segment as it starts: some are forked while it is killed
FORKING = """
import os, sys, time
print(os.getpid(), flush=True)
while True:
    if os.fork() == 0:
        open(f"/dev/shm/torch_{os.getpid()}_{sys.argv[1]}_0", "wb").close()
        time.sleep(60)
        os._exit(0)
    time.sleep(0.002)
"""


def test_processes_forked_as_the_session_is_killed_leave_no_segment():
    token = uuid.uuid4().hex
    try:
        for _ in range(5):
            with session([sys.executable, "-c", FORKING, token], stdout=subprocess.PIPE, text=True) as proc:
                proc.stdout.readline()
                time.sleep(0.3)
            assert not list(SHM.glob(f"torch_*_{token}_0"))
    finally:
        for path in SHM.glob(f"torch_*_{token}_0"):
            path.unlink()


def test_only_the_named_processes_segments_go(tmp_path):
    mine, other = tmp_path / f"torch_{os.getpid() + 1}_5_0", tmp_path / "torch_1_5_0"
    for path in (mine, other):
        path.touch()
    remove_torch_segments([os.getpid() + 1], shm=str(tmp_path))
    assert not mine.exists() and other.exists()
