"""``stallbench analyze`` on jobs written with the frameworks people train with (``examples/frameworks``):
PyTorch Lightning, the Hugging Face Trainer and accelerate, each installed by the test extra, each script
unchanged. The commands are the how-to's own (``docs/how-to/analyze-your-job.md``), run as written. Each
script also times its own training epochs by hand (``--witness``, through the framework's own hooks); the
split stallbench reports must agree with that witness of the same run."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from statistics import fmean

import pytest

REPO = Path(__file__).resolve().parents[1]
HOW_TO = REPO / "docs" / "how-to" / "analyze-your-job.md"
pytestmark = [pytest.mark.slow, pytest.mark.multiproc]
AGREE = 0.10  # each part within 10% of the epoch of the witness's


def blocks(section: str) -> list[str]:
    """The command lines of the how-to's bash blocks under the heading ``section``, up to the next one."""
    text = HOW_TO.read_text()
    body = re.search(rf"^#+ {re.escape(section)}\n(.*?)(?=^#)", text, flags=re.S | re.M)[1]
    return [
        line for b in re.findall(r"```bash\n(.*?)```", body, flags=re.S) for line in b.strip().splitlines()
    ]


def run(line: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(line)
    argv = [sys.executable, "-m", "stallbench", *argv[1:]] if argv[0] == "stallbench" else argv
    argv = [sys.executable if a == "python" else a for a in argv]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, cwd=cwd, env=env, text=True, capture_output=True, timeout=600)
    assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def example_folder(where: Path) -> Path:
    """``where`` with ``examples`` and the images the how-to's first command makes."""
    (where / "examples").symlink_to(REPO / "examples")
    for line in blocks("Jobs written with a framework"):
        run(line, where)
    return where


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return example_folder(tmp_path_factory.mktemp("frameworks"))


def analyzed(folder: Path, line: str) -> tuple[dict, str, list[dict]]:
    """Run one how-to command: the report's JSON, its text, the witness lines of the cold run."""
    argv = shlex.split(line)
    report, witness = (folder / argv[argv.index(flag) + 1] for flag in ("--json", "--witness"))
    done = run(line, folder)
    lines = [json.loads(text) for text in witness.read_text().splitlines()]
    assert len(lines) == 9, lines  # 3 epochs of each run: prep, ingestion, cold
    return json.loads(report.read_text()), done.stdout, lines[-3:]


def shares(loader: dict) -> dict[str, float]:
    epoch = loader["epoch_seconds"]
    stall = loader["prep_stall_seconds"] + loader["fetch_stall_seconds"]
    return {"compute": loader["compute_seconds"] / epoch, "stall": stall / epoch}


def witness_shares(cold: list[dict]) -> dict[str, float]:
    steady = cold[1:]  # as the report: epochs 2..
    epoch = fmean(e["seconds"] for e in steady)
    return {
        "compute": fmean(e["step_seconds"] for e in steady) / epoch,
        "stall": fmean(e["wait_seconds"] for e in steady) / epoch,
    }


@pytest.mark.parametrize("section", ["PyTorch Lightning", "Hugging Face Trainer", "accelerate"])
def test_each_framework_job_is_analyzed_and_agrees_with_its_own_witness(folder, section):
    report, text, cold = analyzed(folder, blocks(section)[0])
    (loader,) = report["loaders"]
    parts = loader["compute_seconds"] + loader["prep_stall_seconds"] + loader["fetch_stall_seconds"]
    assert parts == pytest.approx(loader["epoch_seconds"], rel=0.02)
    assert report["workload"]["batch_size"] == 32 and report["workload"]["samples"] == 360
    measured, witness = shares(loader), witness_shares(cold)
    print(f"{section}: stallbench {measured} vs witness {witness} (shares of the epoch)")
    for part in measured:
        assert abs(measured[part] - witness[part]) <= AGREE, (part, measured, witness, cold)
    assert loader["epoch_seconds"] == pytest.approx(fmean(e["seconds"] for e in cold[1:]), rel=AGREE)
    others = loader["other_loaders"]  # the evaluation: one loader, however often the framework rebuilds it
    assert len(others) == 1 and others[0]["epochs"] >= 3, others
    assert "± " in text and "steady epoch" in text
    if section == "accelerate":  # --accumulate 4: the updates the optimizer made, not the batches
        assert loader["useful"]["updates"] == fmean(e["updates"] for e in cold[1:]) == 3, (
            loader["useful"],
            cold,
        )


def test_lightning_validations_and_checkpoints_inside_an_epoch_agree_with_its_witness(folder):
    """``val_check_interval`` and ``ModelCheckpoint(every_n_train_steps=4)``: the cold run's evaluations and
    checkpoint writes, per epoch, within 10% of the script's own timing (or 5 ms, for a small write), the
    same counts, and the parts of the steady epoch still adding up to it."""
    report, text, cold = analyzed(folder, blocks("PyTorch Lightning")[2])
    (loader,) = report["loaders"]
    (run,) = [r for r in loader["runs"] if r["phase"] == "cold"]
    for epoch, witness in zip(run["epochs"], cold, strict=True):
        for kind in ("evaluation", "checkpoint"):
            (seconds, count), (seen, seen_count) = epoch["transitions"][kind], witness[kind]
            assert count == seen_count and abs(seconds - seen) <= max(AGREE * seen, 0.005), (
                kind,
                epoch,
                witness,
            )
    assert [w["evaluation"][1] for w in cold] == [2, 2, 2] and [w["checkpoint"][1] for w in cold] == [3, 3, 3]
    parts = loader["compute_seconds"] + loader["prep_stall_seconds"] + loader["fetch_stall_seconds"]
    parts += sum(seconds for seconds, _ in loader["transitions"].values())
    assert parts == pytest.approx(loader["epoch_seconds"], rel=0.02)
    assert "evaluation" in text and "checkpoint writes" in text


def test_trainer_evaluations_and_saves_every_few_steps_agree_with_its_witness(folder):
    """``eval_steps`` and ``save_steps``: the cold run's evaluations and checkpoint writes in its first two
    epochs within 10% of the script's own timing (or 5 ms), the same counts (the last epoch also holds the
    save the Trainer makes at the end of training, which the witness counts in it: see the how-to)."""
    report, text, cold = analyzed(folder, blocks("Hugging Face Trainer")[1])
    (loader,) = report["loaders"]
    (run,) = [r for r in loader["runs"] if r["phase"] == "cold"]
    for epoch, witness in zip(run["epochs"][:2], cold[:2], strict=True):
        for kind in ("evaluation", "checkpoint"):
            (seconds, count), (seen, seen_count) = epoch["transitions"][kind], witness[kind]
            assert count == seen_count == 2 and abs(seconds - seen) <= max(AGREE * seen, 0.005), (kind, epoch)
    assert "evaluation" in text and "checkpoint writes" in text


def test_lightning_under_steps_ends_each_epoch_as_its_own_and_still_validates(folder):
    report, _, cold = analyzed(folder, blocks("PyTorch Lightning")[1])
    assert [e["batches"] for e in cold] == [4, 4, 4]  # the script saw 4-batch epochs
    (loader,) = report["loaders"]
    (validation,) = loader["other_loaders"]
    assert validation["epochs"] >= 3  # validation ran at each epoch's end
    assert [e["batches"] for run in loader["runs"] for e in run["epochs"]] == [4] * 9
