"""Benchmark fixtures: where generated data persists between runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEFAULT_BENCH_DATA = Path("/var/tmp/stallbench-bench")  # on the disk (not tmpfs), outside the repository


@pytest.fixture(scope="session")
def bench_data_root() -> Path:
    """Data generated once and kept between runs: ``$STALLBENCH_BENCH_DATA`` or /var/tmp/stallbench-bench."""
    root = Path(os.environ.get("STALLBENCH_BENCH_DATA", DEFAULT_BENCH_DATA))
    root.mkdir(parents=True, exist_ok=True)
    return root
