"""Compute models: chosen by name, emulated steps sleep off-CPU, the real model trains."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stallbench.compute import check_compute, parse_compute

REPO = Path(__file__).resolve().parents[1]


def test_emulated_step_sleeps_without_using_the_cpu():
    step = parse_compute("emulated:30")
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(3):
        step(None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= 0.09 and cpu < 0.5 * wall and step.name == "emulated:30"


def test_cpu_model_learns_from_image_batches():
    step = parse_compute("cpu")
    images = torch.randint(0, 255, (4, 3, 64, 64), dtype=torch.uint8)
    labels = torch.tensor([1, 2, 3, 4])
    before = [p.detach().clone() for p in step.model.parameters()]
    step((images, labels))
    assert any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters(), strict=True))


def test_cpu_model_names_what_it_needs():
    with pytest.raises(ValueError, match="'cpu' needs"):
        parse_compute("cpu")((torch.zeros(4), torch.zeros(4)))


@pytest.mark.parametrize("text", ["gpu", "emulated", "emulated:-1", "emulated:abc", ""])
def test_unknown_or_bad_models_are_named(text):
    with pytest.raises(ValueError, match="emulated"):
        parse_compute(text)


def test_cuda_model_is_refused_without_a_device():
    if torch.cuda.is_available():
        assert parse_compute("cuda").name == "cuda"
    else:
        with pytest.raises(ValueError, match="CUDA"):
            parse_compute("cuda")


@pytest.mark.parametrize("text", ["cpu", "emulated:5", "emulated-tokens:0.5"])
def test_stallbench_checks_its_compute_option_without_importing_torch(text):
    """The CLI's own process never needs torch (1.6 s to import): checking ``--compute`` must not load it."""
    code = (
        "import sys\nfrom stallbench.cli import make_parser\n"
        f"make_parser().parse_args(['analyze', '--data', 'images:10', '--compute', {text!r}])\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


@pytest.mark.parametrize("text", ["gpu", "emulated:-1", "emulated-tokens:x"])
def test_a_bad_compute_option_is_named_before_anything_runs(text):
    with pytest.raises(ValueError, match="emulated"):
        check_compute(text)
