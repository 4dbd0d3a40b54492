"""Generated JPEG folders that benchmarks share, kept between runs under the bench data root."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallbench.conditions.limits import probe_storage_conditions
from stallbench.workloads import make_jpeg_folder

__all__ = ["throttleable_jpegs"]


def throttleable_jpegs(root: Path, records: int, record_bytes: int) -> Path:
    """``records`` JPEGs of ``record_bytes`` (500x375) in ``root/jpeg-<records>x<record_bytes>``, made once;
    fails the benchmark, naming the reasons, where the storage conditions cannot be set up for them."""
    path = make_jpeg_folder(
        root / f"jpeg-{records}x{record_bytes}", num_images=records, record_bytes=record_bytes
    )
    problems = {k: v for k, v in probe_storage_conditions(path).items() if v is not None}
    if problems:
        pytest.fail(f"the storage conditions cannot be set up here: {problems}", pytrace=False)
    return path
