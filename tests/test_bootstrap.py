"""The bootstrap inside the user's own command: a real script in a real subprocess, measured through
``sitecustomize`` and a JobSpec, checked through the records it leaves (``read_records``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from stallbench.batches import batch_samples
from stallbench.jobs._fresh import fresh_copy
from stallbench.jobs._timed import Counters, EpochMeter, TimedIterator
from stallbench.jobs.spec import JOB_ENV, JobSpec, LoaderEpoch, read_records
from tests.helpers import make_jpeg_folder

REPO = Path(__file__).resolve().parents[1]
BOOTSTRAP = REPO / "stallbench" / "jobs" / "_bootstrap"
SCRIPTS = REPO / "tests" / "_user_scripts"
SCRIPT = SCRIPTS / "train_tiny.py"
TORCH_CLASS, OUR_CLASS = "torch.utils.data.DataLoader", "loader.DataLoader"


class Run:
    """What one run of the script left: its exit code, stdout lines (JSON), stderr and records."""

    def __init__(self, proc: subprocess.CompletedProcess, out_dir: Path) -> None:
        self.returncode, self.stderr = proc.returncode, proc.stderr
        self.lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        self.pid = self.lines[0]["pid"] if self.lines else None
        self.epochs = [line for line in self.lines if "epoch" in line]
        self.records = read_records(out_dir) if out_dir.is_dir() else []

    def of(self, loader: str) -> list[LoaderEpoch]:
        return sorted((r for r in self.records if r.loader == loader), key=lambda r: r.epoch)

    def probe(self, key: str) -> object:
        return next(line[key] for line in self.lines if key in line)


def _env(job: Path | None, *extra_path: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in (JOB_ENV, "PYTHONPATH", "RANK", "STALLBENCH_SERVED")
    }
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (BOOTSTRAP, *extra_path, REPO))
    if job is not None:
        env[JOB_ENV] = str(job)
    return env


def _script(env: dict[str, str], *args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(script), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


def _run(
    tmp_path: Path,
    *args: str,
    extra_path: tuple[Path, ...] = (),
    job: bool = True,
    script: Path = SCRIPT,
    **spec: Any,
) -> Run:
    """``script`` under a JobSpec with ``spec``'s fields (``job=False``: no STALLBENCH_JOB at all)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    path = JobSpec(out_dir=str(out), **spec).write(tmp_path / "spec.json") if job else None
    return Run(_script(_env(path, *extra_path), *args, script=script), out)


def _ok(run: Run) -> Run:
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    return run


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.multiproc)])
def test_records_each_epoch_of_each_loader(tmp_path, workers, monkeypatch):
    monkeypatch.setenv("TRAIN_TINY_BURN", "0.004")  # each training sample costs 4 ms of CPU
    run = _ok(_run(tmp_path, "--eval", "--workers", str(workers)))
    assert [(e["train"], e["eval"]) for e in run.epochs] == [(5, 3)] * 3
    train, held_out = run.of("0:RandomData"), run.of("1:RandomData")
    assert len(run.records) == 6 and {r.pid for r in run.records} == {run.pid}
    assert stat.S_IMODE((tmp_path / "out" / f"records-0-{run.pid}.jsonl").stat().st_mode) == 0o600
    assert [r.epoch for r in train] == [1, 2, 3] and [r.epoch for r in held_out] == [1, 2, 3]
    assert {(r.batches, r.samples, r.complete) for r in train} == {(5, 40, True)}
    assert {(r.batches, r.samples, r.complete) for r in held_out} == {(3, 20, True)}
    for r in run.records:
        assert r.loader_class == TORCH_CLASS and r.mode == "pipeline" and r.rank == 0
        assert (r.workers, r.batch_size, r.dataset_len) == (workers, 8, 40 if r in train else 20)
        assert 0 < r.first_batch_seconds <= r.wait_seconds <= r.seconds
        assert r.step_seconds > 0 and r.wait_seconds + r.step_seconds <= r.seconds * 1.01
        assert r.cpu_seconds >= 0 and r.storage_bytes >= 0
    # the samples' CPU counts where they were made: in workers, though they are gone by the epoch's end
    assert all(r.cpu_seconds >= 0.75 * 40 * 0.004 for r in train), [r.cpu_seconds for r in train]


@pytest.mark.multiproc
@pytest.mark.parametrize("persistent", [False, True])
def test_steps_cut_every_epoch_and_the_script_sees_a_normal_end(tmp_path, persistent):
    args = ["--eval", "--workers", "2"] + (["--persistent"] if persistent else [])
    run = _ok(_run(tmp_path, *args, steps=2))
    assert [(e["train"], e["eval"]) for e in run.epochs] == [(2, 2)] * 3
    assert {(r.batches, r.samples, r.complete) for r in run.records} == {(2, 16, True)}
    assert len(run.records) == 6


def test_a_loop_left_early_is_recorded_incomplete(tmp_path):
    run = _ok(_run(tmp_path, "--break-after", "2"))
    train = run.of("0:RandomData")
    assert [(r.epoch, r.batches, r.complete) for r in train] == [(1, 2, False), (2, 2, False), (3, 2, False)]
    assert all(r.seconds >= r.wait_seconds for r in train)


def test_epochs_end_the_process_after_the_training_loaders_epochs(tmp_path):
    run = _ok(_run(tmp_path, "--eval", "--eval-first", "--epochs", "6", epochs=2))
    assert [e["epoch"] for e in run.epochs] == [1, 2] and not any("done" in line for line in run.lines)
    held_out, train = run.of("0:RandomData"), run.of("1:RandomData")  # eval runs first, has fewer batches
    assert [(r.epoch, r.batches, r.complete) for r in train] == [(1, 5, True), (2, 5, True)]
    assert len(held_out) == 3  # the third eval ran before the training loader's third iter()
    assert "stallbench" in run.stderr and "1:RandomData" in run.stderr


def test_a_process_ended_after_its_epochs_runs_its_exit_handlers_flushes_files_skips_teardown(tmp_path):
    log = tmp_path / "written.txt"
    run = _ok(_run(tmp_path, str(log), script=SCRIPTS / "leaves_open.py", epochs=2))
    expected = [f"epoch {epoch} batch {batch}" for epoch in (0, 1) for batch in ([0, 1, 2, 3], [4, 5, 6, 7])]
    assert log.read_text() == "\n".join([*expected, "exit handler ran"]) + "\n"
    assert "module teardown" not in run.stderr  # the interpreter's teardown (0.9 s with torch) was skipped
    plain = _ok(_run(tmp_path / "plain", str(log), script=SCRIPTS / "leaves_open.py", job=False))
    assert "module teardown" in plain.stderr and log.read_text().count("epoch") == 10


@pytest.mark.multiproc
def test_ingestion_makes_its_batches_in_the_main_process_and_hands_out_copies(tmp_path):
    log = tmp_path / "samples.log"
    args = ["--workers", "2", "--eval", "--log", str(log), "--mutate"]
    run = _ok(_run(tmp_path, *args, mode="ingestion", replay_batches=2))
    pids = log.read_text().split()
    assert len(pids) == 2 * 8 and set(pids) == {str(run.pid)}  # no worker ever made a sample
    assert [(e["train"], e["eval"], e["edited"]) for e in run.epochs] == [(5, 3, False)] * 3
    assert {r.mode for r in run.records} == {"ingestion"} and len(run.records) == 6
    assert {(r.batches, r.samples) for r in run.of("0:RandomData")} == {(5, 40)}
    assert {(r.batches, r.samples) for r in run.of("1:RandomData")} == {(3, 24)}  # full batches replayed


def test_ingestion_of_our_loader_with_steps(tmp_path):
    run = _ok(_run(tmp_path, "--ours", "--mutate", mode="ingestion", replay_batches=1, steps=3))
    assert [(e["train"], e["edited"]) for e in run.epochs] == [(3, False)] * 3
    assert {(r.batches, r.mode, r.loader_class) for r in run.records} == {(3, "ingestion", OUR_CLASS)}


def test_ingestion_of_a_loader_without_length_hands_out_replay_batches(tmp_path):
    run = _ok(_run(tmp_path, "--iterable", mode="ingestion", replay_batches=2))
    assert [e["train"] for e in run.epochs] == [2, 2, 2]
    assert run.stderr.count("no length") == 1


@pytest.mark.multiproc
def test_iterable_dataset_with_workers(tmp_path):
    run = _ok(_run(tmp_path, "--iterable", "--workers", "2"))
    train = run.of("0:StreamData")
    assert {(r.batches, r.samples, r.complete, r.dataset_len) for r in train} == {(6, 40, True, None)}
    assert [e["train"] for e in run.epochs] == [6, 6, 6]


def test_loader_choice_torch_makes_our_loader_torchs(tmp_path):
    ours = _ok(_run(tmp_path / "as-is", "--ours", "--probe"))
    assert {r.loader_class for r in ours.records} == {OUR_CLASS}
    assert all("hits" in r.stats and "collate_seconds" in r.stats for r in ours.records)
    swapped = _ok(_run(tmp_path / "torch", "--ours", "--probe", loader="torch"))
    assert {r.loader_class for r in swapped.records} == {TORCH_CLASS} and len(swapped.records) == 3
    assert swapped.probe("cls") == "torch.utils.data.dataloader.DataLoader"
    assert swapped.probe("is_ours") is True and swapped.probe("derived") is True


def test_loader_choice_cached_makes_torchs_loader_ours(tmp_path):
    run = _ok(_run(tmp_path, "--probe", loader="cached", cache_dir=str(tmp_path)))
    assert {r.loader_class for r in run.records} == {OUR_CLASS} and len(run.records) == 3
    assert run.probe("isinstance") is True and run.probe("cls") == "loader.dataloader.DataLoader"
    assert run.probe("derived") is True and run.probe("generic") is True


def test_a_script_that_imports_our_loader_before_torch_gets_our_class_as_it_is(tmp_path):
    script = tmp_path / "ours_first.py"
    script.write_text(
        "import json\n"
        "import loader\n"  # loader imports torch's DataLoader module itself, while it is being made
        "dl = loader.DataLoader(list(range(8)), batch_size=4)\n"
        "base = loader.DataLoader.__mro__[2]\n"
        "print(json.dumps({'pid': 0, 'meta': type(loader.DataLoader).__name__, 'base': base.__module__,"
        " 'n': len(list(dl))}))\n"
    )
    run = _ok(_run(tmp_path, script=script, loader="cached", cache_dir=str(tmp_path)))
    assert run.stderr == ""  # no line about a class that stays on the stand-in
    got = (run.probe("meta"), run.probe("base"), run.probe("n"))
    assert got == ("type", "torch.utils.data.dataloader", 2)


def test_cached_loader_of_a_source_dataset_counts_hits(tmp_path):
    images = make_jpeg_folder(tmp_path / "images", per_class=4, classes=2, size=(16, 16))
    spec = {"loader": "cached", "cache_bytes": 1 << 22, "cache_dir": str(tmp_path)}
    run = _ok(_run(tmp_path, "--images", str(images), "--epochs", "2", **spec))
    first, second = run.of("0:ImageFolder")
    assert (first.misses, second.hits, second.misses) == (8, 8, 0)
    assert first.stats["misses"] == 8 and second.stats["hits"] == 8 and first.loader_class == OUR_CLASS


def test_cached_mode_counts_served_reads_for_other_datasets(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    for i in range(10):
        (files / f"{i:02d}.bin").write_bytes(bytes(range(i, i + 64)))
    spec = {"loader": "cached", "data": (str(files),), "cache_bytes": 1 << 20, "cache_dir": str(tmp_path)}
    run = _ok(_run(tmp_path, "--files", str(files), "--epochs", "2", "--batch-size", "5", **spec))
    first, second = run.of("0:FileData")
    assert (first.hits + first.misses, second.hits, second.misses) == (10, 10, 0)


def test_a_cache_our_loader_refuses_is_dropped_with_one_line_and_the_script_goes_on(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    for i in range(10):
        (files / f"{i:02d}.bin").write_bytes(bytes(range(i, i + 64)))
    spec = {"loader": "cached", "data": (str(files),), "cache_bytes": 64, "cache_dir": str(tmp_path)}
    run = _ok(_run(tmp_path, "--files", str(files), "--epochs", "2", "--batch-size", "5", **spec))
    assert run.stderr.count("loader.DataLoader refused this run's cache (cache_bytes=64 cannot hold") == 1
    first, second = run.of("0:FileData")
    assert first.loader_class == second.loader_class == OUR_CLASS and first.hits + second.hits == 0


def test_an_existing_sitecustomize_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marker = tmp_path / "marker"
    (theirs / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    run = _ok(_run(tmp_path, extra_path=(theirs,)))
    assert marker.read_text() == "ran" and len(run.records) == 3


@pytest.mark.parametrize("breakage", ["stallbench-unimportable", "bad-spec", "out-dir-is-a-file"])
def test_a_bootstrap_error_does_not_crash_the_script(tmp_path, breakage):
    out, extra = tmp_path / "out", ()
    job = JobSpec(out_dir=str(out)).write(tmp_path / "spec.json")
    if breakage == "stallbench-unimportable":
        fake = tmp_path / "fake"
        (fake / "stallbench").mkdir(parents=True)
        (fake / "stallbench" / "__init__.py").write_text("raise ImportError('a broken install')\n")
        extra = (fake,)
    elif breakage == "bad-spec":
        job.write_text('{"out_dir": "x", "mode": "sideways"}')
    else:
        out.write_text("")
    run = _ok(Run(_script(_env(job, *extra)), out))
    assert [e["train"] for e in run.epochs] == [5, 5, 5] and not run.records
    ours = [line for line in run.stderr.splitlines() if line.startswith("stallbench:")]
    assert len(ours) == 1, run.stderr


@pytest.mark.multiproc
def test_spawned_workers_run_the_bootstrap_but_write_nothing(tmp_path):
    run = _ok(_run(tmp_path, "--workers", "2", "--spawn", "--epochs", "2", steps=3))
    assert [e["train"] for e in run.epochs] == [3, 3]
    assert [p.name for p in (tmp_path / "out").iterdir()] == [f"records-0-{run.pid}.jsonl"]
    assert {(r.pid, r.batches) for r in run.records} == {(run.pid, 3)}


def test_without_a_job_nothing_is_patched_or_written(tmp_path):
    run = _ok(_run(tmp_path, "--probe", job=False))
    assert run.probe("stallbench") is False and run.probe("patched") is False
    assert run.probe("iterator") == "_SingleProcessDataLoaderIter"
    assert not (tmp_path / "out").exists()


def test_the_bootstrap_imports_neither_torch_nor_loader_into_a_script_that_does_not(tmp_path):
    """Its counters: loader.system.counters loaded alone from its file (``stallbench.jobs.counters``):
    a ``loader`` module put into the script's process before its own imports would stand in for a project's
    own ``loader.py``. (Asked to swap in our loader, it imports it: that run is ours.)"""
    job = JobSpec(out_dir=str(tmp_path / "out")).write(tmp_path / "spec.json")
    code = "import sys; print(sorted(m for m in ('torch', 'loader', 'pyarrow') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], env=_env(job), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_command_line_starts_without_torch():
    code = "import sys, stallbench.cli; print('torch' in sys.modules, 'loader' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], env=_env(None), capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "False False"), done.stderr


def test_loader_and_the_data_stallbench_sizes_open_without_torch(tmp_path):
    """``import loader`` loads each name when first used; stallbench's own process opens a workload's source
    to size it, and never needs torch (1.5 s) for that."""
    data = make_jpeg_folder(tmp_path / "imgs")
    code = (
        "import sys, loader, loader.system.home\nfrom stallbench.jobs.data import open_source\n"
        f"print(len(open_source({str(data)!r})), sorted({{'torch', 'pyarrow', 'lmdb'}} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_env(None), capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "8 []"), done.stderr
    code = "from loader import DataLoader as Ours\nfrom torch.utils import data\n"
    code += "print(issubclass(Ours, data.DataLoader))"
    done = subprocess.run([sys.executable, "-c", code], env=_env(None), capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr


def test_rank_comes_from_the_environment(tmp_path):
    job = JobSpec(out_dir=str(tmp_path / "out"), steps=1).write(tmp_path / "spec.json")
    env = {**_env(job), "RANK": "3"}
    subprocess.run([sys.executable, str(SCRIPT), "--epochs", "1"], env=env, check=True, capture_output=True)
    (record,) = read_records(tmp_path / "out")
    assert record.rank == 3


@pytest.mark.multiproc
def test_a_killed_run_keeps_its_finished_epochs(tmp_path):
    job = JobSpec(out_dir=str(tmp_path / "out")).write(tmp_path / "spec.json")
    cmd = [sys.executable, str(SCRIPT), "--workers", "2", "--epochs", "1000", "--sleep", "0.02"]
    proc = subprocess.Popen(
        cmd, env=_env(job), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while len(read_records(tmp_path / "out") if (tmp_path / "out").exists() else []) < 2:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        # the script's workers go with it, its session whole: torch's leave by themselves within seconds,
        # but one forked as the script was killed takes init's pid for its parent's and never leaves
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    records = read_records(tmp_path / "out")
    assert len(records) >= 2 and all(r.complete and r.batches == 5 for r in records)
    assert [r.epoch for r in records] == list(range(1, len(records) + 1))


def test_cuda_sync_at_step_boundaries_counts_as_step_time(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: (calls.append(1), time.sleep(0.01)))
    ended = []
    meter = EpochMeter(time.perf_counter(), Counters(), cuda=torch.cuda)
    timed = TimedIterator(iter([torch.zeros(2, 3)] * 3), meter, None, lambda m, end: ended.append(end))
    assert [b.shape[0] for b in timed] == [2, 2, 2]
    assert len(calls) == 3  # before batches 2 and 3, and before the end (the last step's device work)
    assert meter.cuda_sync >= 0.03 and meter.step >= meter.cuda_sync and meter.samples == 6 and ended


def test_steps_end_the_epoch_without_asking_the_real_iterator():
    asked = []

    def batches():
        for i in range(10):
            asked.append(i)
            yield torch.zeros(4)

    meter = EpochMeter(time.perf_counter(), Counters())
    timed = TimedIterator(batches(), meter, 3, lambda m, end: None)
    assert len(list(timed)) == 3 and asked == [0, 1, 2] and meter.batches == 3 and meter.samples == 12


def test_batch_samples_and_fresh_copies():
    from collections import OrderedDict, namedtuple
    from dataclasses import dataclass

    Pair = namedtuple("Pair", "x y")

    @dataclass
    class Batch:
        pixels: torch.Tensor
        names: list[str]

    batch = {"a": Pair(torch.ones(5, 2), [1]), "b": OrderedDict(c=Batch(torch.ones(3), ["n"]))}
    copied = fresh_copy(batch)
    copied["a"].x.zero_()
    copied["b"]["c"].pixels.zero_()
    assert batch["a"].x.sum() == 10 and batch["b"]["c"].pixels.sum() == 3
    assert type(copied["a"]) is Pair and type(copied["b"]) is OrderedDict and type(copied["b"]["c"]) is Batch
    assert (
        batch_samples(batch) == 5 and batch_samples(["text", 3]) == 1 and batch_samples(torch.tensor(1)) == 1
    )
    shared = fresh_copy(batch, shared=True)  # as a worker's batch arrives: in shared memory
    assert shared["a"].x.is_shared() and not copied["a"].x.is_shared()
    assert torch.equal(shared["b"]["c"].pixels, batch["b"]["c"].pixels)


def test_cached_mode_says_when_a_dataset_reads_nothing_it_can_serve(tmp_path):
    files, elsewhere = tmp_path / "files", tmp_path / "elsewhere"
    for folder in (files, elsewhere):
        folder.mkdir()
    for i in range(10):
        (files / f"{i:02d}.bin").write_bytes(bytes(range(i, i + 64)))
    (elsewhere / "other.bin").write_bytes(b"x" * 64)  # --data names files the script never opens
    spec = {"loader": "cached", "data": (str(elsewhere),), "cache_bytes": 1 << 20, "cache_dir": str(tmp_path)}
    run = _ok(_run(tmp_path, "--files", str(files), "--epochs", "2", "--batch-size", "5", **spec))
    assert run.stderr.count("0:FileData read no file under --data through open()") == 1  # said once
    assert all(r.hits + r.misses == 0 for r in run.of("0:FileData"))


def test_tokens_are_counted_only_for_token_batches_whose_padding_is_known():
    """A classifier's (features [B, F], integer labels [B]) has the shape of a padded token batch: its tokens
    are not guessed from that; the generated job's padded batches and a packing collator's packs are
    counted."""
    from torch.utils.data import DataLoader, TensorDataset

    from loader.packing import PackingCollator
    from stallbench.jobs._loaders import token_batches
    from stallbench.jobs.batching import pad_tokens

    labelled = DataLoader(TensorDataset(torch.randn(8, 4), torch.arange(8)), batch_size=4)
    assert token_batches(labelled) == (False, None)
    assert token_batches(DataLoader(range(8), collate_fn=pad_tokens)) == (True, None)
    assert token_batches(DataLoader(range(8), collate_fn=PackingCollator(32))) == (True, 32)
    batch = next(iter(labelled))
    for counts, expected in ((False, (0, 0)), (True, (int(batch[1].sum()), batch[0].numel()))):
        meter = EpochMeter(time.perf_counter(), Counters(), counts_tokens=counts)
        meter.add_batch(meter.start, time.perf_counter(), batch)
        assert (meter.valid_tokens, meter.token_slots) == expected and meter.samples == 4
