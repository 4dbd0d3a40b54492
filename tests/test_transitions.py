"""Transitions under the bootstrap, against the script's own hand timing: evaluation passes and checkpoint
writes (``torch.save``, safetensors) inside a training epoch are taken out of its steps and named, counted
once each; those between epochs are kept apart; the parts still add up to the epoch; on a quiet machine and
with a process burning each core."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator

import pytest

from stallbench.jobs._transitions import reading, since
from stallbench.workloads import make_jpeg_folder
from tests.test_bootstrap import REPO, SCRIPTS, _ok, _run

pytestmark = pytest.mark.serial  # holds figures to a witness within 10%: alone on the machine

SCRIPT = REPO / "examples" / "eval_every_steps.py"
TRAIN, EVAL = "0:Slow", "1:Slow"


def near(measured: float, witness: float) -> bool:
    """Within 10% of the witness, or 5 ms for a short one (the two clocks are read a few calls apart, and on
    a busy machine a time slice can fall between them)."""
    return abs(measured - witness) <= max(0.10 * witness, 0.005)


@contextlib.contextmanager
def burning(busy: bool) -> Iterator[None]:
    """With ``busy``, a process spinning on each core for the block (killed after it, whatever happens)."""
    burn = "import time\nend = time.time() + 120\nwhile time.time() < end: pass\n"
    burners = (
        [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(os.cpu_count() or 1)] if busy else []
    )
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.mark.parametrize(
    ("eval_to_len", "busy"),
    [(False, False), (True, False), (False, True)],
    ids=["exhausted", "to-len", "busy"],
)
def test_evaluations_and_checkpoints_are_named_apart_from_the_steps(tmp_path, eval_to_len, busy):
    args = ["--out", str(tmp_path), *(["--eval-to-len"] if eval_to_len else [])]
    with burning(busy):
        run = _ok(_run(tmp_path, *args, script=SCRIPT))
    train = [r for r in run.of(TRAIN) if r.complete]
    assert [r.epoch for r in train] == [1, 2, 3] and len(run.epochs) == 3
    for record, witness in zip(train, run.epochs, strict=True):
        for kind in ("evaluation", "checkpoint"):
            seconds, count = record.transitions[kind]
            assert count == witness["inside"][kind][1] == 3, (kind, record.transitions)
            assert near(seconds, witness["inside"][kind][0]), (kind, seconds, witness)
        inside = sum(seconds for seconds, _ in record.transitions.values())
        assert record.wait_seconds + record.step_seconds + inside == pytest.approx(record.seconds, rel=0.02)
        assert record.step_seconds >= record.batches * 0.005  # the steps' own sleeps stay steps
    for record, witness in zip(train[1:], run.epochs, strict=False):  # made after the epoch before
        for kind in ("evaluation", "checkpoint"):
            seconds, count = record.transitions_before[kind]
            assert count == 1 and near(seconds, witness["between"][kind][0]), (kind, seconds, witness)
    evaluations = run.of(EVAL)  # 3 inside each epoch, 1 after it; none of them evaluates another loader
    assert len(evaluations) == 12 and all("evaluation" not in r.transitions for r in evaluations)


def test_a_reading_unchanged_since_says_nothing_was_spent():
    assert since(reading()) == {}


def test_the_how_to_block_names_evaluations_and_checkpoints(tmp_path):
    page = (REPO / "docs" / "how-to" / "analyze-your-job.md").read_text()
    block = re.search(r"## Evaluations and checkpoints.*?```bash\n(.*?)```", page, flags=re.S)[1]
    make_jpeg_folder(tmp_path / "my-images", num_images=60, record_bytes=6000, width=64, height=48)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    argv = shlex.split(block.strip())
    argv = [sys.executable, "-m", "stallbench", *argv[1:]]
    argv = [sys.executable if a == "python" else a for a in argv]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {line.split("  ")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert rows["evaluation"].endswith("3 per epoch") and rows["checkpoint writes"].endswith("3 per epoch")
    assert rows["evaluation between epochs (apart)"].endswith("1 per epoch")
    assert rows["checkpoint writes between epochs (apart)"].endswith("1 per epoch")


def test_a_batch_sampled_from_a_fresh_iterator_every_few_steps_is_never_charged_to_one_step(tmp_path):
    """``next(iter(val))`` every 3 steps: each sampled pass ends only at the next ``iter(val)``, steps later;
    what began before a step is never taken out of it (no negative step, the step's own sleeps kept)."""
    script = tmp_path / "sampled.py"
    script.write_text(
        "import json, os, time, torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "train = DataLoader(TensorDataset(torch.arange(48.0)), batch_size=4)\n"
        "val = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)\n"
        "print(json.dumps({'pid': os.getpid()}))\n"
        "for epoch in range(2):\n"
        "    for step, batch in enumerate(train, 1):\n"
        "        time.sleep(0.005)\n"
        "        if step % 3 == 0:\n"
        "            next(iter(val))\n"
        "    print(json.dumps({'epoch': epoch}))\n"
    )
    run = _ok(_run(tmp_path, script=script))
    train = [r for r in run.of("0:TensorDataset") if r.complete]
    assert [r.batches for r in train] == [12, 12]
    for record in train:
        assert min(step for _, step in record.timeline) >= 0.0
        assert record.step_seconds >= record.batches * 0.005
        assert record.wait_seconds + record.step_seconds + sum(
            s for s, _ in record.transitions.values()
        ) == pytest.approx(record.seconds, rel=0.02)


def test_torch_compile_first_compilations_are_warm_up_and_a_recompile_a_transition(tmp_path):
    """The first calls compile (epoch 1: of the warm-up), a batch of another shape recompiles (epoch 2):
    each within 10% of the script's own witness, the step's excess over its epoch's median step."""
    run = _ok(_run(tmp_path, script=SCRIPTS / "compiled.py"))
    train = [r for r in run.of("0:TensorDataset") if r.complete]
    assert [r.epoch for r in train] == [1, 2, 3] and [e["epoch"] for e in run.epochs] == [1, 2, 3]
    first, recompiled, steady = train
    assert "compilation" not in steady.transitions
    for record, witness in ((first, run.epochs[0]), (recompiled, run.epochs[1])):
        seconds, count = record.transitions["compilation"]
        assert count >= 1 and near(seconds, witness["excess"]), (seconds, witness)


def test_compile_timing_survives_a_reset_and_a_torch_that_passes_no_arguments():
    """``torch._dynamo.reset()`` clears the compiler's callbacks: they are registered again. torch before
    2.8 calls them with no argument: they take any, and never raise into the compile."""
    import torch._dynamo
    import torch._dynamo.callback as callback

    from stallbench.jobs import _transitions

    _transitions.watched_modules()["torch._dynamo.callback"](callback)
    torch._dynamo.reset()
    assert _transitions._compile_started in callback.callback_handler.start_callbacks
    before = reading()
    _transitions._compile_started()
    _transitions._compile_ended()
    assert since(before)["compilation"][1] == 1
