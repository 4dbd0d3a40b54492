"""Running the user's own command once: output through, exit codes back, nothing left behind."""

from __future__ import annotations

import io
import os
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from stallbench.jobs.command import CommandFailed, run_command
from stallbench.jobs.spec import JOB_ENV, JobSpec

SCRIPTS = Path(__file__).with_name("_user_scripts")
SPEC = JobSpec(out_dir="")


def _scratch_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"stallbench-job-{os.getpid()}-*")}


def test_a_failing_command_gives_its_exit_code_and_last_lines():
    before = _scratch_dirs()
    with pytest.raises(CommandFailed) as failed:
        run_command([sys.executable, str(SCRIPTS / "exit_code.py"), "3"], SPEC, log=io.StringIO())
    assert failed.value.returncode == 3
    assert any("stdout line, exiting with 3" in line for line in failed.value.tail)
    assert any("stderr line, exiting with 3" in line for line in failed.value.tail)
    assert "exited with code 3" in str(failed.value)
    assert _scratch_dirs() == before


def test_the_command_output_passes_through_and_it_sees_the_spec():
    log = io.StringIO()
    code = f"import os, json; print(json.load(open(os.environ['{JOB_ENV}']))['steps'])"
    run = run_command([sys.executable, "-c", code], JobSpec(out_dir="", steps=7), log=log)
    assert log.getvalue().strip() == "7"
    assert run.records == () and not run.timed_out


def test_the_commands_stderr_goes_to_stderr_and_its_stdout_to_stdout(capfd):
    code = "import sys; print('to stdout', flush=True); print('to stderr', file=sys.stderr, flush=True)"
    run_command([sys.executable, "-c", code], SPEC)
    out, err = capfd.readouterr()
    assert "to stdout" in out and "to stderr" not in out
    assert "to stderr" in err and "to stdout" not in err


def test_a_time_limit_ends_the_whole_tree_and_keeps_what_was_done(tmp_path):
    marker = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = io.StringIO()
    run = run_command([sys.executable, "-c", code], SPEC, time_limit=2.0, log=log)
    assert run.timed_out and run.seconds < 30
    assert "started" in log.getvalue()
    child = int(marker.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_killed_command_is_named_with_its_signal():
    code = "import os, signal; print('about to go', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    with pytest.raises(CommandFailed) as failed:
        run_command([sys.executable, "-c", code], SPEC, log=io.StringIO())
    assert failed.value.returncode == -9
    assert "was killed by SIGKILL (the kernel's OOM killer, at a memory limit?)" in str(failed.value)
    assert "about to go" in str(failed.value)
