"""Benchmark fixtures: where generated data persists between runs, and the digits job's data."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

DEFAULT_BENCH_DATA = Path("/var/tmp/stallbench-bench")  # on the disk (not tmpfs), outside the repository


@pytest.fixture(scope="session")
def bench_data_root() -> Path:
    """Data generated once and kept between runs: ``$STALLBENCH_BENCH_DATA`` or /var/tmp/stallbench-bench."""
    root = Path(os.environ.get("STALLBENCH_BENCH_DATA", DEFAULT_BENCH_DATA))
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="session")
def digits_data(bench_data_root: Path) -> Path:
    """The digits job's JPEGs (``_digits_job.py make``), written once under ``bench_data_root``."""
    from stallbench.jobs.run import run_job

    root = bench_data_root / "digits-v1"
    if not (root / "test").is_dir():
        shutil.rmtree(root, ignore_errors=True)
        run_job([sys.executable, str(Path(__file__).with_name("_digits_job.py")), "make", str(root)])
    return root
