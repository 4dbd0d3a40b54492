"""The other work on the machine during a run: seen when another process burns CPU, and the run's own
command (and its children) never counted as other work."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stallbench.conditions.load import OtherLoad, is_busy

BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"


def _burner(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BURN.format(seconds=seconds)])


@pytest.mark.multiproc
def test_a_process_burning_a_core_beside_the_run_is_other_work():
    burner = _burner(4.0)
    try:
        time.sleep(0.3)  # it has started
        with OtherLoad() as load:
            time.sleep(1.5)
    finally:
        burner.kill()
        burner.wait()
    assert load.cores > 0.6 and is_busy(load.cores, 2)


@pytest.mark.multiproc
def test_the_runs_own_command_and_its_children_are_not_other_work():
    code = (
        BURN.format(seconds=1.5)
        + "import subprocess, sys\n"
        + (f"subprocess.run([sys.executable, '-c', {BURN.format(seconds=1.0)!r}])\n")
    )
    with OtherLoad() as alone:
        time.sleep(1.0)
    with OtherLoad() as load:
        subprocess.run([sys.executable, "-c", code], check=True)
    assert load.cores < alone.cores + 0.3  # 2.5 CPU seconds of its own, none of them other work's


def test_a_tenth_of_the_cores_is_where_a_machine_is_busy():
    assert not is_busy(0.2, 2) and is_busy(0.21, 2) and is_busy(0.5, 4) and not is_busy(0.4, 4)
