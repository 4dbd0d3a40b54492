"""``stallbench analyze|compare -- COMMAND`` on the example training script, unchanged, end to end."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from loader.system.home import default_cache_dir
from stallbench.workloads import make_jpeg_folder
from tests.helpers import STOPS, stops_at_defaults

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_cnn.py"
SCRIPTS = Path(__file__).with_name("_user_scripts")
pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_jpeg_folder(
        tmp_path_factory.mktemp("data") / "imgs", num_images=400, record_bytes=6000, width=64, height=48
    )


def stallbench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "stallbench", *args]
    return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=timeout, cwd=REPO)


def train(data: Path, *extra: str) -> list[str]:
    return ["--", sys.executable, str(EXAMPLE), "--data", str(data), "--epochs", "5", *extra]


def analyze(data: Path, tmp_path: Path, *options: str, steps: int = 3, script: tuple[str, ...] = ()) -> dict:
    out = tmp_path / "report.json"
    done = stallbench(
        "analyze", "--data", str(data), "--steps", str(steps), "--epochs", "3", "--no-progress", "--json",
        str(out), *options, *train(data, *script),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def example_report(images, tmp_path_factory) -> dict:
    """The example analyzed as it is (no option of stallbench's, none of its own), run once for the tests
    that check its report: the splits, and the quiet run the CPU burner's run is held against."""
    return analyze(images, tmp_path_factory.mktemp("example"))


def test_the_example_gets_all_three_splits_and_its_eval_loader_apart(images, example_report):
    report = example_report
    (loader,) = report["loaders"]
    assert loader["loader"] == "torch"  # the script's own: torch's DataLoader
    assert [run["phase"] for run in loader["runs"]] == ["ingestion", "prep", "cold"]
    for run in loader["runs"]:
        assert [e["batches"] for e in run["epochs"]] == [3, 3, 3]  # --steps cut each epoch, 3 epochs
    assert loader["compute_seconds"] > 0 and loader["epoch_seconds"] >= loader["compute_seconds"] * 0.5
    assert [o["loader"] for o in loader["other_loaders"]] == ["1:ImageFolderDataset"]
    assert report["workload"]["command"].endswith(f"--data {images} --epochs 5")


@pytest.fixture(scope="module")
def prep_bound(images, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """A slow Dataset (3 ms a sample) on one worker, analyzed with ``--apply``: what stallbench printed, and
    its report. One run for the tests of the prep stall and of ``--apply``."""
    folder = tmp_path_factory.mktemp("prep-bound")
    done = stallbench(
        "analyze", "--data", str(images), "--epochs", "3", "--no-progress", "--quiet", "--log",
        str(folder / "log.txt"), "--json", str(folder / "report.json"), "--apply",
        *train(images, "--workers", "1", "--slow-ms", "3"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads((folder / "report.json").read_text())


def test_a_slow_dataset_shows_as_prep_stall(prep_bound):
    loader = prep_bound[1]["loaders"][0]
    assert loader["prep_stall_seconds"] > 2 * loader["compute_seconds"]
    assert loader["prep_stall_seconds"] > 2 * loader["fetch_stall_seconds"]  # no throttle: fetch is noise
    assert loader["roofline"]["bound"] == "prep"


def test_a_throttled_disk_shows_as_fetch_stall(tmp_path):
    # 2,000 files of 20 KB: an epoch of 2 batches reads ~6% of them, mostly ones not read before (2.6 MB:
    # 1.3 s at 2 MB/s, against ~0.1 s of prep and compute). The split is per batch, so 2 batches show it as 3
    # do; and 1% held out, not 10%: the evaluation loader's reads (apart from the training loader's split)
    # only take time
    data = make_jpeg_folder(tmp_path / "big", num_images=2000, record_bytes=20_000, width=64, height=48)
    throttled = analyze(
        data, tmp_path, "--storage-bandwidth", "2MB/s", steps=2, script=("--eval-fraction", "0.01")
    )
    loader = throttled["loaders"][0]
    assert loader["fetch_stall_seconds"] > loader["prep_stall_seconds"]
    assert loader["fetch_stall_seconds"] > loader["compute_seconds"]


def test_a_failing_script_gives_exit_1_and_its_message(images):
    done = stallbench(
        "analyze",
        "--data",
        str(images),
        "--no-progress",
        "--",
        sys.executable,
        str(SCRIPTS / "exit_code.py"),
        "3",
    )
    assert done.returncode == 1
    assert "exited with code 3" in done.stderr
    assert "stderr line, exiting with 3" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_slow_rank_how_to_runs_as_written_and_names_the_rank_that_holds_the_others(tmp_path):
    """The how-to's torchrun block (with ``--json``): a breakdown per rank, the slowest named, and the rank
    whose data the others wait for at the collectives, in the table and the JSON."""
    page = (REPO / "docs" / "how-to" / "analyze-your-job.md").read_text()
    block = re.search(r"## Slow ranks.*?```bash\n(.*?)```", page, flags=re.S)[1]
    make_jpeg_folder(tmp_path / "my-images", num_images=60, record_bytes=6000, width=64, height=48)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    argv = shlex.split(block.strip())
    torchrun = argv.index("torchrun")
    argv[torchrun : torchrun + 1] = [sys.executable, "-m", "torch.distributed.run"]
    argv = [sys.executable, "-m", "stallbench", argv[1], "--json", "ranks.json", *argv[2:]]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    loader = json.loads((tmp_path / "ranks.json").read_text())["loaders"][0]
    ranks = {r["rank"]: r for r in loader["ranks"]}
    assert sorted(ranks) == [0, 1] and loader["holding_rank"] == 1
    assert loader["slowest_rank"] == max(ranks.values(), key=lambda r: r["epoch_seconds"])["rank"]
    assert ranks[0]["waits_for_others_seconds"] > 0.2 > ranks[1]["waits_for_others_seconds"]
    last = [json.loads((tmp_path / f"witness-{r}.jsonl").read_text().splitlines()[-1]) for r in (0, 1)]
    held = last[0]["collective"] - last[1]["collective"]  # the cold run's last epoch, timed by the script
    assert abs(ranks[1]["holds_others_seconds"] - held) <= max(0.1 * held, 0.005), (ranks, last)
    assert "<- slowest" in done.stdout and "rank 1's data holds the others: they wait" in done.stdout


def test_the_slow_samples_how_to_runs_as_written_and_names_ready_first(tmp_path):
    """The how-to's two commands (analyze-your-job.md shows the first): the slow samples found and named, and
    the advice naming ``ready_first=True`` to torch's loader where a few slow batches make half the wait or
    more, and telling ours, which has it on, that what is left is the slow samples' own prep."""
    page = (REPO / "docs" / "how-to" / "slow-samples.md").read_text()
    block = re.search(r"## See it.*?```bash\n(.*?)```", page, flags=re.S)[1]
    shown = (REPO / "docs" / "how-to" / "analyze-your-job.md").read_text()
    (command,) = re.search(r"## Slow samples.*?```bash\n(.*?)```", shown, flags=re.S)[1].strip().splitlines()
    assert command == block.strip().splitlines()[0]  # analyze-your-job's, run below as this page's first
    make_jpeg_folder(tmp_path / "my-images", num_images=10, record_bytes=6000, width=64, height=48)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    reports = []
    for line in block.strip().splitlines():
        argv = [sys.executable if a == "python" else a for a in shlex.split(line)]
        argv = [sys.executable, "-m", "stallbench", argv[1], "--json", "r.json", *argv[2:]]
        done = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        reports.append((json.loads((tmp_path / "r.json").read_text())["loaders"][0], done.stdout))
    (torch_report, torch_text), (_, ours_text) = reports
    for report, text in reports:  # the advice names ready_first where slow batches make half the wait
        words = " ".join(text.split())
        assert "slow batches (4x p50)" in text and report["slow_batches"] > 0, text
        named = report["slow_batches_wait_share"] >= 0.5 and report["slow_again"] >= 0.5
        assert ("ready_first=True" in words) == named, text
    assert "with ready_first=True on" not in " ".join(torch_text.split())
    assert "keeps them from" not in " ".join(ours_text.split())
    # every 100th sample is the script's slow one (25 ms against 0.5): each found, the slowest named
    assert torch_report["slow_sample_count"] >= 1600 // 100, torch_report["slow_samples"]
    assert torch_report["slow_again"] >= 0.5  # mostly the same samples, epoch after epoch: the data's own
    assert all(s["index"] % 100 == 0 and s["seconds"] > 0.01 for s in torch_report["slow_samples"])
    assert f"#{torch_report['slow_samples'][0]['index']} " in torch_text


def _left_by(pid: int) -> list[str]:
    """What stallbench process ``pid`` could leave: its cgroups, scratch folders, caches in /dev/shm."""
    places = [
        (Path("/sys/fs/cgroup/memory"), f"stallbench-{pid}-*"),
        (Path("/sys/fs/cgroup/blkio"), f"stallbench-{pid}-*"),
        (Path(tempfile.gettempdir()), f"stallbench-job-{pid}-*"),
        (default_cache_dir(), f"stallbench-run-{pid}-*"),
    ]
    return [str(p) for folder, pattern in places for p in folder.glob(pattern)]


@pytest.mark.parametrize("signum", STOPS[:2], ids=lambda s: s.name)  # SIGHUP: test_cli
def test_a_stop_leaves_no_process_cgroup_or_scratch_folder(images, tmp_path, signum):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "stallbench", "analyze", "--data", str(images), "--no-progress"]
    argv += train(images, "--slow-ms", "20")  # slow: still running when stopped
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=stops_at_defaults,
    )  # fmt: skip
    tree: set[psutil.Process] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(str(EXAMPLE) in " ".join(p.cmdline()) for p in tree):
        time.sleep(0.2)
        with contextlib.suppress(psutil.Error):
            tree |= set(psutil.Process(proc.pid).children(recursive=True))
    assert tree, "the example never started"
    time.sleep(2)  # the example is training
    with contextlib.suppress(psutil.Error):
        tree |= set(psutil.Process(proc.pid).children(recursive=True))
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err[-2000:]
    assert ("interrupted" if signum == signal.SIGINT else f"stopped by {signum.name}") in err
    assert "Traceback" not in err
    _, alive = psutil.wait_procs(tree, timeout=5)  # a process killed as stallbench exits may take a moment
    assert not [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE], f"left running: {alive}"
    assert not _left_by(proc.pid)


def test_apply_runs_the_advised_setting_and_says_how_near_the_prediction_was(prep_bound):
    (line,) = [line for line in prep_bound[0].stdout.splitlines() if line.startswith("--apply")]
    match = re.search(r"(\d+) workers: steady epoch predicted ([\d.]+) s, measured ([\d.]+) s", line)
    assert match, line
    workers, predicted, measured = int(match[1]), float(match[2]), float(match[3])
    assert workers > 1  # prep-bound on one worker: more workers advised
    assert abs(measured / predicted - 1) < 0.5  # the figure of record is in the benchmark (15%)
    verdicts = ("the prediction holds", "off the prediction by more than", "the run contradicts")
    assert sum(v in line for v in verdicts) == 1, line


def test_the_how_to_example_runs_as_written(tmp_path):
    page = (REPO / "docs" / "how-to" / "analyze-your-job.md").read_text()
    block = re.search(r"## Try it on the example.*?```bash\n(.*?)```", page, flags=re.S)[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    (tmp_path / "examples").symlink_to(REPO / "examples")
    outputs = []
    for line in block.strip().splitlines():
        argv = shlex.split(line)
        argv = [sys.executable, "-m", "stallbench", *argv[1:]] if argv[0] == "stallbench" else argv
        argv = [sys.executable if a == "python" else a for a in argv]
        done = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    assert "prep stall" in outputs[-1] and "evaluation loader 1:ImageFolderDataset" in outputs[-1]
    assert "epoch 1: train loss" in outputs[-1]


def test_compare_runs_ours_with_its_cache_at_work_and_the_time_to_target_per_loader(images, tmp_path):
    """One compare of a user's script that reads its own files (read through our cache) and measures its
    time to a target with ``stallbench.time_to_target``; ``--quiet`` sends its output to the log."""
    out, log = tmp_path / "compare.json", tmp_path / "log.txt"
    script = ["--", sys.executable, str(SCRIPTS / "train_to_target.py"), "--data", str(images)]
    done = stallbench(
        "compare", "--data", str(images), "--epochs", "3", "--no-progress", "--quiet", "--log", str(log),
        "--json", str(out), *script, "--epochs", "3",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "time to target" in done.stdout
    torch_report, ours = json.loads(out.read_text())["loaders"]
    assert (torch_report["loader"], ours["loader"]) == ("torch", "cached")
    cold = ours["runs"][2]["epochs"]
    assert sum(e["hits"] for e in cold[1:]) > 0  # the script's own file reads went through our cache
    assert sum(e["hits"] + e["misses"] for e in torch_report["runs"][2]["epochs"]) == 0
    assert "updates, " in log.read_text() and "updates, " not in done.stdout  # the script's summary line
    for report in (torch_report, ours):
        got = report["useful"]["time_to_target"]
        assert got["target"] == 0.05 and got["reached"] == (got["value"] <= 0.05)
        assert 1 <= got["epochs"] <= 3 and got["updates"] == got["epochs"] * 25  # 400 files, batches of 16
        assert got["seconds"] > 0


def _shares(report: dict) -> dict[str, float]:
    (loader,) = report["loaders"]
    return {
        p: loader[f"{p}_seconds"] / loader["epoch_seconds"] for p in ("compute", "prep_stall", "fetch_stall")
    }


def test_a_cpu_burner_on_every_core_leaves_the_split_or_is_named(images, example_report, tmp_path):
    """The same analyze, quiet and with a process burning each core: each part stays within 10 points of the
    epoch, or the report says the machine was busy and its figures cannot be separated from that load."""
    quiet = example_report  # the example's plain run, with nothing of this test's burning
    burn = "import time\nend = time.time() + 300\nwhile time.time() < end: pass\n"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(os.cpu_count() or 1)]
    try:
        out = tmp_path / "busy.json"
        done = stallbench(
            "analyze", "--data", str(images), "--steps", "3", "--epochs", "3", "--no-progress", "--json",
            str(out), *train(images),
        )  # fmt: skip
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    busy = json.loads(out.read_text())
    apart = {p: abs(busy_share - _shares(quiet)[p]) for p, busy_share in _shares(busy).items()}
    named = "busy machine" in done.stdout and "cannot separate" in " ".join(done.stdout.split())
    assert max(apart.values()) <= 0.10 or named, (apart, done.stdout[-3000:])
    load = {name: max(run["other_load_cores"] for run in r["loaders"][0]["runs"]) for name, r in
            (("quiet", quiet), ("busy", busy))}  # fmt: skip
    assert load["busy"] > 0.5 and load["busy"] > load["quiet"] + 0.3, load
    for report in (quiet, busy):
        loader = report["loaders"][0]
        parts = loader["compute_seconds"] + loader["prep_stall_seconds"] + loader["fetch_stall_seconds"]
        assert parts == pytest.approx(loader["epoch_seconds"], rel=0.02)


def test_apply_runs_the_form_of_record_advised_for_a_script_that_forced_raw_bytes(tmp_path):
    data = make_jpeg_folder(tmp_path / "photos", num_images=240)  # 500x375: decode binds
    out, log = tmp_path / "report.json", tmp_path / "log.txt"
    script = ["--", sys.executable, str(SCRIPTS / "train_ours.py"), "--data", str(data), "--epochs", "5"]
    done = stallbench(
        "analyze", "--data", str(data), "--epochs", "3", "--no-progress", "--quiet", "--log", str(log),
        "--json", str(out), "--apply", *script,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (report,) = json.loads(out.read_text())["loaders"]
    weighed = {p["form"]: p for p in report["form_predictions"]}
    assert weighed["raw"]["as_run"] and weighed["prepared"]["epoch_seconds"] < weighed["raw"]["epoch_seconds"]
    assert "cache_form='prepared' would bring the epoch to" in report["advice"]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("--apply")]
    assert re.search(r"2 workers, loader\.DataLoader with cache_form='prepared': steady epoch", line)
    assert log.read_text().count("cache_form prepared") == 3  # the applied run's 3 epochs held it


def test_memory_limit_auto_is_sized_from_the_commands_own_memory(images, tmp_path):
    from stallbench.conditions.limits import probe_storage_conditions

    if (problem := probe_storage_conditions(images)["memory_limit"]) is not None:
        pytest.skip(f"--memory-limit needs a memory cgroup: {problem}")
    report = analyze(images, tmp_path, "--memory-limit", "auto", "--loader", "torch")
    limit = report["workload"]["memory_limit"]
    # python, torch, the model and 2 workers, measured, and the margins (32 MiB, <= 128 MiB kept free)
    assert isinstance(limit, int) and 300 << 20 < limit < 2 << 30, limit
    (loader,) = report["loaders"]
    (cold,) = [run for run in loader["runs"] if run["phase"] == "cold"]
    assert "memory limited to" in cold["condition"]
