"""``stallbench compare --jobs N``: the aggregation on hand-made records, its table and JSON, the usage
errors, and the command end to end (the docs' commands on tiny data, a failing job, Ctrl-C)."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from loader.system.home import default_cache_dir
from stallbench.analysis.concurrent import ConcurrentRun, job_run
from stallbench.analysis.request import AnalysisRequest
from stallbench.analysis.results import Workload
from stallbench.cli import main, make_parser
from stallbench.demo import concurrent_hint
from stallbench.jobs.run import JobFailed
from stallbench.jobs.spec import LoaderEpoch, WorkloadJob
from stallbench.report.concurrent import concurrent_to_json, format_concurrent, validate_concurrent_json
from tests.helpers import stops_at_defaults

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
JSON_DOC = REPO / "docs" / "stallbench-json.md"
WORKLOAD = Workload("images-48", 200_704, 192_000, 48, 8, 1, "emulated:10", 2, 100_352, None, None)
JOB_ROW = r"^\s*({loader})\s+{job}\s+\d+\.\d\d\s"  # a job's row: loader, job, s/epoch
TINY = ["--data", "images:48", "--epochs", "1", "--batch-size", "8", "--workers", "1", "--no-progress"]


def _epoch(epoch: int, start: float, seconds: float, cpu: float, coordination=None) -> LoaderEpoch:
    return LoaderEpoch(
        loader="0:ImageFolder", rank=0, pid=1, epoch=epoch, seconds=seconds, wait_seconds=0.1,
        step_seconds=seconds - 0.1, first_batch_seconds=0.05, batches=6, samples=48, storage_bytes=0,
        cpu_seconds=cpu, complete=True, loader_class="loader.DataLoader", start_time=start,
        end_time=start + seconds, stats={"coordination": coordination} if coordination else {},
    )  # fmt: skip


def _shared(prepared: int, consumed: int = 12, saved: float = 0.5, status: str = "member") -> dict:
    return dict(
        group="g", status=status, members=3, batches_prepared=prepared, batches_consumed=consumed,
        prep_cpu_seconds=0.25, prep_cpu_saved_seconds=saved,
    )  # fmt: skip


def _runs() -> tuple[ConcurrentRun, ConcurrentRun]:
    """Torch's 3 jobs from t=100 to t=104 (288 samples: 72/s); ours from t=200 to t=202 (144/s)."""
    torch = [
        job_run(i, [_epoch(1, 99.5 + i / 2, 1.5, 0.8), _epoch(2, 101 + i / 2, 1.5, 0.6)]) for i in (1, 2, 3)
    ]
    ours = [
        job_run(i, [_epoch(1, 200, 1.0, 0.3), _epoch(2, 201, 1.0, 0.2, _shared(4, saved=0.5 * i))])
        for i in (1, 2, 3)
    ]
    return ConcurrentRun("torch", tuple(torch)), ConcurrentRun("cached", tuple(ours))


def test_a_job_is_read_from_its_epoch_records():
    coordination = _shared(5)
    run = job_run(2, [_epoch(1, 10.0, 1.5, 0.8), _epoch(2, 11.5, 0.5, 0.4, coordination)])
    assert run.job == 2 and run.epoch_seconds == (1.5, 0.5) and run.cpu_seconds == (0.8, 0.4)
    assert run.samples == 96 and run.batches == 12
    assert (run.start_time, run.end_time) == (10.0, 12.0)
    assert run.mean_epoch_seconds == 1.0 and run.mean_cpu_seconds == pytest.approx(0.6)
    assert run.coordination == coordination  # the totals at the end, from the last epoch
    assert job_run(1, [_epoch(1, 0.0, 1.0, 0.1)]).coordination is None
    with pytest.raises(JobFailed, match="job 3 finished no epoch"):
        job_run(3, [])


def test_aggregate_is_all_samples_over_first_start_to_last_end():
    torch, ours = _runs()
    assert torch.samples == ours.samples == 3 * 2 * 48
    assert torch.wall_seconds == pytest.approx(4.0)  # 100 (job 1 starts) to 104 (job 3 ends)
    assert torch.samples_per_s == pytest.approx(72.0)
    assert ours.wall_seconds == pytest.approx(2.0) and ours.samples_per_s == pytest.approx(144.0)
    instant = ConcurrentRun("torch", (job_run(1, [_epoch(1, 5.0, 0.0, 0.0)]),))
    assert math.isnan(instant.samples_per_s)


def test_table_shows_both_loaders_the_ratio_and_every_job():
    text = format_concurrent(_runs(), WORKLOAD)
    assert max(len(line) for line in text.splitlines()) <= 100
    rows = {tuple(line.split()[:2]) for line in text.splitlines() if line.split()}
    assert {("torch", "3"), ("cached", "3")} <= rows  # the summary: loader, jobs
    summary = next(line.split() for line in text.splitlines() if line.split()[:2] == ["cached", "3"])
    assert summary[2:] == ["288", "2.00", "144.00", "2.00x"]  # samples, wall s, samples/s, vs torch
    jobs = [
        line.split()
        for line in text.splitlines()
        if re.match(JOB_ROW.format(loader="torch|cached", job=r"\d"), line)
    ]
    assert [row[:2] for row in jobs] == [[k, str(i)] for k in ("torch", "cached") for i in (1, 2, 3)]
    assert jobs[0][2:] == ["1.50", "0.70", "-", "-", "-", "-"]  # s/epoch, CPU s/epoch, no group
    assert jobs[4][2:] == ["1.00", "0.25", "4", "12", "1.00", "member"]  # job 2: saved 0.5 x 2


def test_table_shortens_a_job_left_alone():
    torch, ours = _runs()
    alone = job_run(1, [_epoch(1, 200, 1.0, 0.3, _shared(12, 12, 0.0, "alone: fell behind by 16 batches"))])
    text = format_concurrent([torch, ConcurrentRun("cached", (alone, *ours.jobs[1:]))], WORKLOAD)
    assert re.search(r"cached\s+1\s+1\.00\s+0\.30\s+12\s+12\s+0\.00\s+alone$", text, flags=re.M)


def test_json_holds_the_figures_and_its_schema():
    obj = json.loads(json.dumps(concurrent_to_json(_runs(), WORKLOAD), allow_nan=False))
    validate_concurrent_json(obj)
    assert obj["schema"] == "stallbench.concurrent/2" and obj["jobs_per_loader"] == 3
    assert obj["workload"]["data"] == "images-48"
    torch, ours = obj["loaders"]
    assert (torch["loader"], torch["samples"], torch["wall_seconds"]) == ("torch", 288, pytest.approx(4.0))
    assert ours["samples_per_s"] == pytest.approx(144.0)
    assert obj["ratios_to_baseline"] == {"cached": {"samples_per_s": pytest.approx(2.0)}}
    assert torch["jobs"][0]["coordination"] is None
    assert [j["coordination"]["batches_prepared"] for j in ours["jobs"]] == [4, 4, 4]
    assert ours["jobs"][2]["epoch_seconds"] == [1.0, 1.0] and ours["jobs"][2]["cpu_seconds"] == [0.3, 0.2]


def test_json_of_an_empty_window_has_null_not_nan():
    instant = ConcurrentRun("torch", (job_run(1, [_epoch(1, 5.0, 0.0, 0.0)]),))
    obj = concurrent_to_json([instant, _runs()[1]], WORKLOAD)
    assert obj["loaders"][0]["samples_per_s"] is None
    assert obj["ratios_to_baseline"]["cached"]["samples_per_s"] is None
    validate_concurrent_json(json.loads(json.dumps(obj, allow_nan=False)))


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("jobs_per_loader",), None, "jobs_per_loader is missing"),
        (("loaders", 1, "jobs", 0, "coordination", "batches_prepared"), 1.5, "coordination.batches_prepared"),
        (("loaders", 1, "jobs", 2, "coordination"), None, "loaders[1].jobs[2].coordination is missing"),
        (("loaders", 0, "jobs", 1, "epoch_seconds"), 1.0, "loaders[0].jobs[1].epoch_seconds must be list"),
        (("ratios_to_baseline", "cached", "samples_per_s"), "2x", "cached.samples_per_s"),
        (("schema",), "stallbench.report/2", "schema must be 'stallbench.concurrent/2'"),
    ],
)
def test_broken_json_is_named(path, value, named):
    broken = copy.deepcopy(concurrent_to_json(_runs(), WORKLOAD))
    *parents, last = path
    target = broken
    for key in parents:
        target = target[key]
    if value is None:
        del target[last]
    else:
        target[last] = value
    with pytest.raises(ValueError, match=re.escape(named)):
        validate_concurrent_json(broken)


def _keys(obj: object) -> set[str]:
    """Every key of a JSON value, less the loader names under ``ratios_to_baseline``."""
    if isinstance(obj, list):
        return set().union(*(_keys(item) for item in obj))
    if not isinstance(obj, dict):
        return set()
    found = set(obj)
    for key, value in obj.items():
        found |= (
            set().union(*(_keys(v) for v in value.values())) if key == "ratios_to_baseline" else _keys(value)
        )
    return found


def test_every_key_is_documented_in_its_own_section():
    obj = concurrent_to_json(_runs(), WORKLOAD)
    section = JSON_DOC.read_text().split("\n## `compare --jobs N`")[1]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    assert _keys({k: v for k, v in obj.items() if k != "workload"}) | {"workload"} == documented


def test_a_job_takes_a_group_and_its_size():
    job = WorkloadJob("cached", "/data", coordinate="stallbench-compare-1-1", group_size=3)
    assert WorkloadJob.from_json(job.to_json()) == job
    assert WorkloadJob("torch", "/data").coordinate is None
    with pytest.raises(ValueError, match="coordinate must be a group name"):
        WorkloadJob("cached", "/data", coordinate="")
    with pytest.raises(ValueError, match="group_size must be a positive int, got 0"):
        WorkloadJob("cached", "/data", coordinate="g", group_size=0)


@pytest.mark.parametrize(
    ("extra", "culprit"),
    [
        (["--jobs", "0"], "argument --jobs: expected a positive integer, got '0'"),
        (["--jobs", "two"], "argument --jobs: expected a positive integer, got 'two'"),
        (["--jobs", "2", "--", "python", "train.py"], "--jobs runs copies of a generated workload"),
        (["--jobs", "1", "--", "python", "train.py"], "takes no command after --"),
        (
            ["--jobs", "3", "--storage-bandwidth", "200MB/s"],
            "--storage-bandwidth does not act on compare --jobs",
        ),
        (["--jobs", "3", "--memory-limit", "1G", "--plot", "c.png"], "--memory-limit does not act on"),
    ],
)
def test_usage_errors_exit_2_naming_jobs(extra, culprit, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--data", "images:8", "--data-dir", str(tmp_path), *extra])
    assert exit_.value.code == 2
    assert culprit in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before any data was made


def test_analyze_has_no_jobs(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", "--data", "images:8", "--jobs", "2"])
    assert exit_.value.code == 2 and "unrecognized arguments: --jobs 2" in capsys.readouterr().err


@pytest.mark.parametrize("data_dir", [Path("stallbench-data"), Path("/tmp/my data")])
def test_the_demo_mentions_a_runnable_jobs_command(data_dir):
    hint = concurrent_hint(AnalysisRequest(data="images", data_dir=data_dir))
    assert "hyper-parameter search" in hint
    command = next(line.strip() for line in hint.splitlines() if line.strip().startswith("stallbench "))
    args = make_parser().parse_args(shlex.split(command)[1:])
    assert (args.command, args.jobs, str(args.data), args.data_dir) == ("compare", 3, "images", data_dir)


def _docs_commands() -> list[str]:
    """Every ``stallbench compare --jobs`` command the README and the docs show."""
    lines = [line.split("#")[0].strip() for doc in DOCS for line in doc.read_text().splitlines()]
    return [line for line in lines if line.startswith("stallbench compare") and "--jobs" in line]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def _stallbench(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "stallbench", *argv]
    return subprocess.run(cmd, cwd=cwd, env=_env(), text=True, capture_output=True, timeout=300)


def _leftovers(pid: int) -> list[Path]:
    return list(default_cache_dir().glob(f"stallbench-run-{pid}-*"))


def test_the_docs_show_a_jobs_command():
    assert any(cmd.startswith("stallbench compare --jobs 3 ") for cmd in _docs_commands())


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("command", _docs_commands())
def test_each_docs_jobs_command_runs_and_shares_every_batch_once(command, tmp_path):
    """The command as shown, on 48 images in 6 batches of 8, one epoch (the options after it win)."""
    argv = [*shlex.split(command)[1:], *TINY, "--data-dir", str(tmp_path), "--json", "c.json"]
    done = _stallbench(argv, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = int(argv[argv.index("--jobs") + 1])
    out = [line.split() for line in done.stdout.splitlines()]
    assert ["loader", "jobs", "samples", "wall", "s", "samples/s", "vs", "torch"] in out
    assert [row[:3] for row in out if row[:2] in (["torch", str(jobs)], ["cached", str(jobs)])][:2] == [
        ["torch", str(jobs), str(48 * jobs)],
        ["cached", str(jobs), str(48 * jobs)],
    ]
    obj = json.loads((tmp_path / "c.json").read_text())
    validate_concurrent_json(obj)
    torch, ours = obj["loaders"]
    ratio = ours["samples_per_s"] / torch["samples_per_s"]
    assert obj["ratios_to_baseline"]["cached"]["samples_per_s"] == pytest.approx(ratio)
    assert f"{ratio:.2f}x" in done.stdout
    for loader in (torch, ours):
        assert [job["job"] for job in loader["jobs"]] == list(range(1, jobs + 1))
        assert all(job["samples"] == 48 and job["batches"] == 6 for job in loader["jobs"])
        assert all(
            re.search(JOB_ROW.format(loader=loader["loader"], job=j), done.stdout, re.M)
            for j in range(1, jobs + 1)
        )
    assert all(job["coordination"] is None for job in torch["jobs"])
    shared = [job["coordination"] for job in ours["jobs"]]
    assert [c["status"] for c in shared] == ["member"] * jobs
    assert sum(c["batches_prepared"] for c in shared) == 6  # each batch of the epoch made once, by someone
    assert [c["batches_consumed"] for c in shared] == [6] * jobs
    assert len({c["group"] for c in shared}) == 1


def _broken_folder(root: Path) -> Path:
    from stallbench.workloads import make_jpeg_folder

    data = make_jpeg_folder(root / "data", num_images=16, num_classes=2, width=64, height=48)
    (data / "class_00" / "zz_broken.jpg").write_bytes(b"not a jpeg")
    return data


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_failing_job_exits_1_and_leaves_nothing(tmp_path):
    argv = ["compare", "--jobs", "2", *TINY, "--data", str(_broken_folder(tmp_path)), "--transform", "train"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallbench", *argv], cwd=tmp_path, env=_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=stops_at_defaults,
    )  # fmt: skip
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert "stallbench compare: error: the command" in err and "exited with code 1" in err
    assert "zz_broken.jpg" in err  # where
    assert not _leftovers(proc.pid)


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)  # SIGINT: test_cli
def test_a_stop_kills_every_job_and_exits_128_plus_its_number(tmp_path, signum):
    argv = [
        "compare",
        "--jobs",
        "2",
        "--loaders",
        "cached",
        *TINY,
        "--epochs",
        "200",
        "--data-dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallbench", *argv], cwd=tmp_path, env=_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=stops_at_defaults,
    )  # fmt: skip
    try:
        me = psutil.Process(proc.pid)
        while (
            proc.poll() is None
            and len([p for p in me.children() if "stallbench.jobs.workload" in p.cmdline()]) < 2
        ):
            time.sleep(0.05)
        time.sleep(4)  # into their epochs: joined, staging batches
        children = me.children(recursive=True)
        assert len(children) >= 4, children  # two jobs and a worker each
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 128 + signum, err
    stopped = "interrupted" if signum == signal.SIGINT else f"stopped by {signum.name}"
    assert f"stallbench compare: {stopped}" in err and "Traceback" not in err
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not _leftovers(proc.pid)
