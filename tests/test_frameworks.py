"""``stallbench analyze`` on jobs written with the frameworks people train with (``examples/frameworks``):
PyTorch Lightning, the Hugging Face Trainer and accelerate, each installed by the test extra, each script
unchanged. Each script also times its own training epochs by hand (``--witness``, through the framework's
own hooks); the split stallbench reports must agree with that witness of the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import fmean

import pytest

from stallbench.workloads import make_jpeg_folder

REPO = Path(__file__).resolve().parents[1]
FRAMEWORKS = REPO / "examples" / "frameworks"
pytestmark = [pytest.mark.slow, pytest.mark.multiproc]
SCRIPTS = ("lightning_train.py", "hf_trainer_train.py", "accelerate_train.py")
AGREE = 0.10  # each part within 10% of the epoch of the witness's


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_jpeg_folder(
        tmp_path_factory.mktemp("data") / "imgs", num_images=400, record_bytes=6000, width=64, height=48
    )


def analyze(images: Path, tmp_path: Path, script: str, *options: str) -> tuple[dict, str, list[dict]]:
    """The report's JSON, its text and the witness lines of the cold run (the last of the three runs)."""
    out, witness = tmp_path / "report.json", tmp_path / "witness.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    argv = [
        sys.executable, "-m", "stallbench", "analyze", "--data", str(images), "--epochs", "3",
        "--no-progress", "--json", str(out), *options, "--", sys.executable, str(FRAMEWORKS / script),
        "--data", str(images), "--epochs", "3", "--witness", str(witness),
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [json.loads(line) for line in witness.read_text().splitlines()]
    assert len(lines) == 9, lines  # 3 epochs of each run: prep, ingestion, cold
    return json.loads(out.read_text()), done.stdout, lines[-3:]


def shares(loader: dict) -> dict[str, float]:
    epoch = loader["epoch_seconds"]
    return {
        "compute": loader["compute_seconds"] / epoch,
        "stall": (loader["prep_stall_seconds"] + loader["fetch_stall_seconds"]) / epoch,
    }


def witness_shares(cold: list[dict]) -> dict[str, float]:
    steady = cold[1:]  # as the report: epochs 2..
    epoch = fmean(e["seconds"] for e in steady)
    return {
        "compute": fmean(e["step_seconds"] for e in steady) / epoch,
        "stall": fmean(e["wait_seconds"] for e in steady) / epoch,
    }


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_framework_job_is_analyzed_and_agrees_with_its_own_witness(images, tmp_path, script):
    report, text, cold = analyze(images, tmp_path, script)
    (loader,) = report["loaders"]
    parts = loader["compute_seconds"] + loader["prep_stall_seconds"] + loader["fetch_stall_seconds"]
    assert parts == pytest.approx(loader["epoch_seconds"], rel=0.02)
    assert report["workload"]["batch_size"] == 32 and report["workload"]["samples"] == 360
    measured, witness = shares(loader), witness_shares(cold)
    for part in measured:
        assert abs(measured[part] - witness[part]) <= AGREE, (part, measured, witness, cold)
    assert loader["epoch_seconds"] == pytest.approx(fmean(e["seconds"] for e in cold[1:]), rel=AGREE)
    others = loader["other_loaders"]  # the evaluation: one loader, however often the framework rebuilds it
    assert [o["loader"] for o in others] == [others[0]["loader"]] and others[0]["epochs"] >= 3, others
    assert "± " in text and "steady epoch" in text


def test_lightning_under_steps_ends_each_epoch_as_its_own_and_still_validates(images, tmp_path):
    report, _, cold = analyze(images, tmp_path, "lightning_train.py", "--steps", "4")
    assert [e["batches"] for e in cold] == [4, 4, 4]  # the script saw 4-batch epochs
    (loader,) = report["loaders"]
    (validation,) = loader["other_loaders"]
    assert validation["epochs"] >= 3  # validation ran at each epoch's end
    assert [e["batches"] for run in loader["runs"] for e in run["epochs"]] == [4] * 9
