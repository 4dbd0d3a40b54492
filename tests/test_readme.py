"""Every command the README shows starts and does its job, on a small generated image folder.

Paths the README uses as examples (``/data/imagenet/train``, ``/data/train``, ``train.py``) are replaced by a
folder of 96 small JPEGs and the example script; the demo runs on 96 images instead of 6,000; ``make test`` is
what CI runs and ``make bench`` is checked by ``test_packaging``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stallbench.workloads import make_jpeg_folder

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("readme") / "train"
    return make_jpeg_folder(root, num_images=96, record_bytes=6000, width=64, height=48)


def test_the_use_it_block_runs(images, tmp_path, monkeypatch, shm_dir):
    (code,) = blocks("python")
    code = code.replace('"/data/imagenet/train"', repr(str(images))).replace("num_workers=8", "num_workers=2")
    code = code.replace("batch_size=256", "batch_size=16").replace(
        'cache_bytes="auto"', "cache_bytes=1 << 20"
    )
    code = code.replace("\n)", f", cache_dir={str(shm_dir)!r}\n)", 1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    stats = namespace["dl"].stats()
    assert stats.misses == 96 and stats.records_cached == 96


def _commands() -> list[str]:
    lines = [line.split("#")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    return [line for line in lines if line.startswith("stallbench ")]


def test_the_readme_shows_the_commands_this_test_runs():
    verbs = [shlex.split(c)[1] for c in _commands()]
    assert verbs == ["analyze", "compare", "analyze", "compare", "simulate", "demo"]


@pytest.mark.parametrize("command", _commands())
def test_each_stallbench_command_runs(command, images, tmp_path, demo_run):
    train = f"{sys.executable} {REPO / 'examples' / 'train_cnn.py'} --data {images} --epochs 4"
    command = command.replace("/data/train", str(images)).replace("python train.py", train)
    argv = [sys.executable, "-m", "stallbench", *shlex.split(command)[1:], "--no-progress"]
    if "--" in argv:  # stallbench's own options go before the user's command
        at = argv.index("--")
        argv = [*argv[:at], "--no-progress", *argv[at:-1]]
    if argv[3] == "demo":  # on 96 images in a folder of its own; one run for this and test_demo's checks
        _, done = demo_run(*argv[4:])
    else:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=600)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert "epoch time" in done.stdout or "hit rate" in done.stdout  # a report came out
