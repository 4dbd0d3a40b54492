"""``stallbench analyze`` on the framework examples against their own witness, on a quiet machine and with a
CPU burner on every core.

Each of ``examples/frameworks/{lightning_train,hf_trainer_train,accelerate_train}.py`` times its own epochs
through its framework's hooks (``--witness``). The how-to's command for it
(``docs/how-to/analyze-your-job.md``) is run as written, quiet, then again with one process spinning on each
core: stallbench's compute share and stall share of the steady epoch must each be within 10 points of the
witness's in the same run, or, with the burner, the report must say that the machine was busy and it cannot
separate the figures from that load.

    python -m pytest benchmarks/bench_frameworks.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.test_frameworks import AGREE, analyzed, blocks, example_folder, shares, witness_shares

SECTIONS = ("PyTorch Lightning", "Hugging Face Trainer", "accelerate")
BURN = "import time\nend = time.time() + 900\nwhile time.time() < end: pass\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return example_folder(tmp_path_factory.mktemp("frameworks"))


@contextmanager
def burner() -> Iterator[None]:
    """A process spinning on each core, killed on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _named_busy(text: str) -> bool:
    return "busy machine" in text and "cannot separate" in " ".join(text.split())


@pytest.mark.benchmark(group="frameworks")
@pytest.mark.parametrize("machine", ["quiet", "CPU burner"])
@pytest.mark.parametrize("section", SECTIONS)
def test_each_framework_agrees_with_its_witness(benchmark, folder: Path, section: str, machine: str) -> None:
    line = blocks(section)[0]

    argv = shlex.split(line)
    witness = folder / argv[argv.index("--witness") + 1]

    def measure() -> tuple[dict, str, list[dict]]:
        witness.unlink(missing_ok=True)  # the script appends: one run's epochs only
        if machine == "quiet":
            return analyzed(folder, line)
        with burner():
            return analyzed(folder, line)

    report, text, cold = benchmark.pedantic(measure, rounds=1, iterations=1)
    (loader,) = report["loaders"]
    measured, witness = shares(loader), witness_shares(cold)
    apart = {part: abs(measured[part] - witness[part]) for part in measured}
    benchmark.extra_info.update(stallbench=measured, witness=witness, apart=apart)
    print(f"\n{section}, {machine}: stallbench {measured} vs witness {witness}")
    named = machine != "quiet" and _named_busy(text)
    assert max(apart.values()) <= AGREE or named, (apart, text[-2000:])
