"""The command line through a subprocess: help, every bad input (exit 2), a full run, and Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import psutil
import pytest

from loader.system.home import default_cache_dir
from stallbench.analysis.request import NamedWorkload, parse_data
from stallbench.conditions.limits import probe_storage_conditions
from stallbench.report import validate_report_json
from tests.helpers import stops_at_defaults

REPO = Path(__file__).resolve().parents[1]
CGROUPS = [Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/blkio")]
STOPPING = (signal.SIGTERM, signal.SIGHUP)
TINY = ["--batch-size", "8", "--epochs", "2", "--workers", "1", "--no-progress"]


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def stallbench(*args: str, cwd: Path, extra_env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "stallbench", *args]
    run_env = {**env(), **(extra_env or {})}
    return subprocess.run(cmd, cwd=cwd, env=run_env, text=True, capture_output=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def top_help(tmp_path_factory) -> str:
    """What ``stallbench --help`` prints, run once for every command's check that it is listed."""
    return stallbench("--help", cwd=tmp_path_factory.mktemp("help")).stdout


@pytest.mark.parametrize("command", ["analyze", "compare", "simulate", "demo"])
def test_help(tmp_path, command, top_help):
    assert command in top_help
    done = stallbench(command, "--help", cwd=tmp_path)
    assert done.returncode == 0 and "--json" in done.stdout and "--plot" in done.stdout


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (["analyze", "--data", "/no/such/folder"], "no such data: '/no/such/folder'"),
        (["analyze", "--data", "videos:3"], "no such data: 'videos:3'"),
        (
            ["analyze", "--data", "s3:///train"],
            "an object storage location is s3://bucket/prefix, got 's3:///train'",
        ),
        (["analyze", "--data", "images:8", "--compute", "tpu"], "unknown compute model 'tpu'"),
        (["analyze", "--data", "images:8", "--cache", "12QB"], "'12QB'"),
        (["analyze", "--data", "images:8", "--cache=-3G"], "-3G"),
        (["analyze", "--data", "images:8", "--storage-bandwidth", "fast"], "'fast'"),
        (["analyze", "--data", "images:8", "--plot", "out.jpg"], "out.jpg"),
        (["compare", "--data", "images:8", "--loaders", "torch,dali"], "dali"),
        (["simulate", "--dataset", "12QB", "--cache", "1G"], "'12QB'"),
        (["simulate", "--dataset", "1G", "--cache", "1G", "--record-size", "2G"], "record_bytes"),
        (["analyze", "--data", "images:0"], "argument --data: the count in 'images:0'"),
        (["analyze", "--data", "tokens:0"], "argument --data: the count in 'tokens:0'"),
        (["analyze", "--data", "images:-5"], "argument --data: the count in 'images:-5'"),
        (["compare", "--data", "images:many"], "argument --data: the count in 'images:many'"),
        (["analyze", "--data", "tokens:"], "argument --data: the count in 'tokens:'"),
        (["analyze"], "--data"),
        ([], "COMMAND"),
        (["analyze", "--data", "images:8", "--cache", "-5G"], "argument --cache: '-5G'"),
        (["compare", "--data", "images:8", "--storage-bandwidth", "-1MB/s"], "'-1MB/s'"),
        (["analyze", "--data", "images:8", "--"], "nothing after --"),
        (["analyze", "--data", ".", "--", "no-such-command-xyz"], "not found or is not executable: 'no-such"),
        # an option the target does not honour, named with why, not ignored
        (
            ["analyze", "--data", ".", "--workers", "4", "--", "true"],
            "--workers does not act on your command",
        ),
        (["compare", "--data", ".", "--transform", "eval", "--", "true"], "--transform does not act on your"),
        (["analyze", "--data", ".", "--steps", "4"], "--steps does not act on a generated workload"),
        (["compare", "--data", ".", "--apply"], "--apply does not act on a generated workload"),
        (["analyze", "--data", ".", "--quiet"], "--quiet does not act on a generated workload"),
    ],
)
def test_bad_input_exits_2_naming_the_culprit(tmp_path, args, culprit):
    done = stallbench(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert culprit in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("images", NamedWorkload("images", None)),
        ("tokens:2000", NamedWorkload("tokens", 2000)),
        ("/data/train", Path("/data/train")),
        ("images-backup", Path("images-backup")),
    ],
)
def test_data_is_parsed_once_into_a_path_or_a_named_workload(text, parsed):
    assert parse_data(text) == parsed
    assert str(parsed) == text


@pytest.mark.parametrize("command", [["demo"], ["analyze", "--data", "images:8"]])
@pytest.mark.parametrize("under", ["", "sub"])
def test_data_dir_that_is_a_file_is_a_usage_error(tmp_path, command, under):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a regular file")
    done = stallbench(*command, "--data-dir", str(blocker / under), "--no-progress", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"argument --data-dir: '{blocker}' exists and is not a directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_empty_data_folder_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    done = stallbench("analyze", "--data", str(tmp_path / "empty"), *TINY, cwd=tmp_path)
    assert done.returncode == 2 and "empty" in done.stderr and "Traceback" not in done.stderr


def test_cgroups_without_permission_exit_2(tmp_path, monkeypatch, capsys):
    from stallbench.cli import main
    from stallbench.conditions import limits

    reason = "creating a cgroup needs root (running as uid 65534)"
    probe = {"page_cache_eviction": None, "memory_limit": reason, "storage_bandwidth": reason}
    monkeypatch.setattr(limits, "probe_storage_conditions", lambda path: probe)
    argv = [
        "analyze",
        "--data",
        "images:8",
        "--data-dir",
        str(tmp_path),
        "--storage-bandwidth",
        "10MB/s",
        *TINY,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--storage-bandwidth cannot be enforced here: {reason}" in err


def test_simulate_prints_writes_json_and_plot(tmp_path):
    done = stallbench(
        "simulate",
        "--dataset",
        "10G",
        "--cache",
        "5G",
        "--nodes",
        "2",
        "--json",
        "s.json",
        "--plot",
        "s.png",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "minio-partitioned" in done.stdout and "lru" in done.stdout
    written = json.loads((tmp_path / "s.json").read_text())
    assert [s["policy"] for s in written["simulations"]] == ["lru", "minio", "minio-partitioned"]
    schema = json.loads((REPO / "docs" / "stallbench-simulate.schema.json").read_text())
    jsonschema.validate(written, schema)  # the published schema, with jsonschema itself
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**written, "schema": "stallbench.simulate/0"}, schema)
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.multiproc
def test_analyze_end_to_end(tmp_path):
    scratch = tmp_path / "tmpdir"  # the run's TMPDIR: no process may leave a pymp-* folder in it
    scratch.mkdir()
    done = stallbench(
        "analyze",
        "--data",
        "images:24",
        "--data-dir",
        str(tmp_path),
        *TINY,
        "--json",
        "a.json",
        "--plot",
        "a.png",
        cwd=tmp_path,
        extra_env={"TMPDIR": str(scratch)},
    )
    assert done.returncode == 0, done.stderr
    assert not list(scratch.iterdir())
    for row in (
        "compute",
        "prep stall",
        "fetch stall",
        "storage read",
        "cache hit rate",
        "roofline",
        "what-if",
    ):
        assert row in done.stdout
    report = json.loads((tmp_path / "a.json").read_text())
    validate_report_json(report)
    assert report["loaders"][0]["loader"] == "cached" and (tmp_path / "a.png").stat().st_size > 10_000


def _running(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def leftovers(pid: int) -> set[str]:
    """Cache folders and cgroups made by the stallbench process ``pid`` (both carry its pid)."""
    shm = {p.name for p in default_cache_dir().glob(f"stallbench-run-{pid}-*")}
    groups = {p.name for root in CGROUPS if root.is_dir() for p in root.glob(f"stallbench-{pid}-*")}
    return shm | groups


@pytest.mark.slow
@pytest.mark.multiproc
def test_sigterm_writes_results_so_far_and_leaves_nothing(tmp_path):
    """A scheduler's SIGTERM (``scancel``, ``timeout``) ends a run as Ctrl-C does (the other stops: below)."""
    cmd = [sys.executable, "-m", "stallbench", "compare", "--data", "images:24", "--data-dir", str(tmp_path)]
    # the interrupt comes as cached's cold run starts: its 5 epochs outlast that many times over, as 40 did
    cmd += ["--batch-size", "8", "--workers", "1", "--epochs", "5", "--json", "c.json"]
    cmd += ["--storage-bandwidth", "50MB/s", "--memory-limit", "1G"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=stops_at_defaults,
    )  # fmt: skip
    seen = ""
    while "cached: ingestion done" not in seen and proc.poll() is None:
        seen += proc.stderr.read(1)  # the progress bar says when the baseline is done
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, seen + err
    assert (
        "stallbench compare: stopped by SIGTERM; writing what was measured so far" in err and "torch" in out
    )
    assert [e["loader"] for e in json.loads((tmp_path / "c.json").read_text())["loaders"]] == ["torch"]
    time.sleep(0.5)
    assert not _running(children)
    assert not leftovers(proc.pid)


def start(*args: str, cwd: Path, extra_env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "stallbench", *args]
    run_env = {**env(), **(extra_env or {})}
    return subprocess.Popen(
        cmd, cwd=cwd, env=run_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=stops_at_defaults,
    )  # fmt: skip


def wait_for(proc: subprocess.Popen, ready) -> None:
    """Poll (no time limit of its own: pytest-timeout bounds it) until ``ready()`` or the process ends."""
    while not ready() and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()


def interrupt(proc: subprocess.Popen, signum: int) -> tuple[list[psutil.Process], str]:
    """``signum`` now; the process's descendants just before, and its stderr."""
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    return children, err


def assert_clean_interrupt(
    proc: subprocess.Popen, err: str, children: list[psutil.Process], signum: int
) -> None:
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err, err
    time.sleep(0.5)
    assert not _running(children)
    assert not leftovers(proc.pid)


def stopped_line(command: str, signum: int) -> str:
    """What stallbench says on stderr when ``signum`` stops ``command``."""
    how = "interrupted" if signum == signal.SIGINT else f"stopped by {signum.name}"
    return f"stallbench {command}: {how}"


@pytest.mark.slow
@pytest.mark.parametrize("signum", STOPPING, ids=lambda s: s.name)  # Ctrl-C: the memory probe's
def test_a_stop_during_generation_exits_128_plus_its_number_and_leaves_nothing(tmp_path, signum):
    data = tmp_path / "data"
    proc = start("demo", "--data-dir", str(data), "--num-images", "100000", "--no-progress", cwd=tmp_path)
    wait_for(proc, lambda: any(data.glob("images-100000.tmp-*/class_*/*.jpg")))  # generating
    children, err = interrupt(proc, signum)
    assert_clean_interrupt(proc, err, children, signum)
    assert stopped_line("demo", signum) in err
    assert not list(data.iterdir())  # the half-made workload is gone


@pytest.mark.slow
@pytest.mark.multiproc
def test_sighup_as_a_compare_s_first_job_runs_stops_it_and_writes_nothing(tmp_path):
    """A closed terminal (SIGHUP) while the first loader's job runs: no loader is done, so no JSON is
    written (SIGTERM once one is done: ``test_sigterm_writes_results_so_far_and_leaves_nothing``)."""
    args = ["compare", "--data", "images:48", "--data-dir", str(tmp_path), *TINY, "--epochs", "500"]
    proc = start(*args, "--json", "c.json", cwd=tmp_path)
    try:
        wait_for(proc, lambda: _a_job_s_workers_run(proc.pid))
        children, err = interrupt(proc, signal.SIGHUP)
    finally:
        proc.kill()
        proc.communicate()
    assert_clean_interrupt(proc, err, children, signal.SIGHUP)
    assert stopped_line("compare", signal.SIGHUP) in err
    assert not (tmp_path / "c.json").exists()


def _simulating(pid: int) -> bool:
    """Whether the stallbench process ``pid`` is past its imports, into the simulation (a second of CPU)."""
    with contextlib.suppress(psutil.Error):
        return sum(psutil.Process(pid).cpu_times()[:2]) > 1.0
    return False


@pytest.mark.parametrize("signum", STOPPING, ids=lambda s: s.name)
def test_a_stop_during_simulate_exits_128_plus_its_number_and_writes_nothing(tmp_path, signum):
    """simulate starts no process: a stop ends it at once, with no half-written JSON."""
    args = ["simulate", "--dataset", "40G", "--cache", "16G", "--record-size", "4K", "--epochs", "500"]
    proc = start(*args, "--json", "s.json", "--no-progress", cwd=tmp_path)
    try:
        wait_for(proc, lambda: _simulating(proc.pid))
        children, err = interrupt(proc, signum)
    finally:
        proc.kill()
        proc.communicate()
    assert_clean_interrupt(proc, err, children, signum)
    assert stopped_line("simulate", signum) in err
    assert not list(tmp_path.iterdir())


def _a_job_s_workers_run(pid: int) -> bool:
    """Whether a generated job under the stallbench process ``pid`` has its DataLoader workers running."""
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "stallbench.jobs.workload" in " ".join(child.cmdline()) and child.children():
                return True
    return False


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_stallbench_killed_with_sigkill_leaves_no_job_and_nothing_behind(tmp_path):
    """SIGKILL runs no handler: the run's watchdog kills its jobs' sessions (the job, its workers) and
    removes the run's cache folder, cgroups and the jobs' temporary folders (issue 46)."""
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    args = ["analyze", "--data", "images:48", "--data-dir", str(tmp_path), *TINY, "--epochs", "500"]
    proc = start(*args, cwd=tmp_path, extra_env={"TMPDIR": str(scratch)})
    tree: list[psutil.Process] = []
    try:
        wait_for(proc, lambda: _a_job_s_workers_run(proc.pid))
        tree = psutil.Process(proc.pid).children(recursive=True)  # the job, its workers, the watchdog
        proc.kill()
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 15
        temp = [scratch, Path("/tmp")]  # a job's TMPDIR goes in /tmp where the scratch's path is too long
        while _running(tree) or leftovers(proc.pid) or any(any(d.glob(f"*-{proc.pid}-*")) for d in temp):
            left = (_running(tree), leftovers(proc.pid), [list(d.glob(f"*-{proc.pid}-*")) for d in temp])
            assert time.monotonic() < deadline, f"still there 15 s after the kill: {left}"
            time.sleep(0.05)
    finally:
        for process in tree:
            with contextlib.suppress(psutil.Error):
                process.kill()
        proc.kill()
        proc.communicate()


def in_use(pid: int) -> set[str]:
    """Which of a per-run cache folder and a run's cgroup the stallbench process ``pid`` has now."""
    shm = any(default_cache_dir().glob(f"stallbench-run-{pid}-*"))
    groups = any(root.glob(f"stallbench-{pid}-*") for root in CGROUPS if root.is_dir())
    return {name for name, present in (("shm", shm), ("cgroup", groups)) if present}


def _cgroup_v1_problem() -> str | None:
    from stallbench.conditions.limits import probe_storage_conditions

    problems = probe_storage_conditions(Path(__file__).parent)
    return problems["memory_limit"] or problems["page_cache_eviction"]


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_during_memory_probe_exits_128_plus_its_number_and_leaves_nothing(tmp_path, signum):
    if (problem := _cgroup_v1_problem()) is not None:
        pytest.skip(f"--memory-limit auto needs a cgroup v1 memory controller: {problem}")
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    args = ["analyze", "--data", "images:48", "--data-dir", str(tmp_path), "--memory-limit", "auto", *TINY]
    proc = start(*args, cwd=tmp_path, extra_env={"TMPDIR": str(scratch)})
    # the probe's jobs make the first per-run cache folders (the real runs come after measuring the machine);
    # a job runs once its cgroup is there too
    wait_for(proc, lambda: {"shm", "cgroup"} <= in_use(proc.pid))
    children, err = interrupt(proc, signum)
    assert_clean_interrupt(proc, err, children, signum)
    assert stopped_line("analyze", signum) in err
    assert not list(scratch.iterdir())


@pytest.mark.slow
@pytest.mark.multiproc
def test_memory_limit_auto_is_sized_for_a_generated_workload_too(tmp_path):
    if (problem := _cgroup_v1_problem()) is not None:
        pytest.skip(f"--memory-limit auto needs a cgroup v1 memory controller: {problem}")
    args = ["--data", "images:24", "--data-dir", str(tmp_path), "--memory-limit", "auto", "--loader", "torch"]
    done = stallbench("analyze", *args, *TINY, "--json", "a.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "a.json").read_text())
    limit = report["workload"]["memory_limit"]
    assert isinstance(limit, int) and 100 << 20 < limit < 2 << 30, limit  # python, torch, the job: measured
    (cold,) = [run for run in report["loaders"][0]["runs"] if run["phase"] == "cold"]
    assert "memory limited to" in cold["condition"]


def test_a_memory_limit_too_small_for_python_says_so_in_words(tmp_path):
    problems = probe_storage_conditions(tmp_path)
    if problems["memory_limit"] is not None:
        pytest.skip(f"needs a memory cgroup: {problems['memory_limit']}")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(b"a" * 4096)
    generated = ("--data", "images:8")
    command = ("--data", str(tmp_path / "data"), "--", sys.executable, "-c", "pass")
    for target in (generated, command):  # said before any run, for either target
        done = stallbench("analyze", "--memory-limit", "1M", *target, cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr  # a value too small: a usage error
        said = "--memory-limit 1.05 MB is too small: the kernel killed a bare Python process"
        assert said in done.stderr and "runs:" not in done.stderr
