"""argparse ``type=`` parsers: each names what it could not read, and argparse turns that into exit code 2."""

from __future__ import annotations

import argparse
from pathlib import Path

from stallbench.analysis.request import CacheSpec, Data, NamedWorkload, ObjectData, parse_data
from stallbench.conditions.sizes import parse_size

__all__ = [
    "bandwidth",
    "cache_spec",
    "compute_spec",
    "data_dir",
    "data_spec",
    "memory_spec",
    "positive_int",
    "seconds",
    "size",
]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A positive number of seconds, e.g. ``600`` or ``90.5``."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def size(text: str) -> int:
    """``"1.5G"``, ``"300MB"``, ``"12000"`` -> bytes."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bandwidth(text: str) -> int:
    """``"200MB/s"`` or ``"200MB"`` -> bytes per second (must be positive)."""
    try:
        value = parse_size(text[:-2] if text.endswith("/s") else text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a bandwidth must be a positive size per second, got {text!r}")
    return value


def cache_spec(text: str) -> int | CacheSpec:
    """``"50%"`` (of the dataset) or a size such as ``"1G"``."""
    if text.endswith("%"):
        try:
            share = float(text[:-1]) / 100
        except ValueError:
            share = -1.0
        if not 0 < share <= 10:
            raise argparse.ArgumentTypeError(
                f"expected a percentage of the dataset such as 50%, got {text!r}"
            )
        return CacheSpec(share)
    value = size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a cache size must be positive, got {text!r}")
    return value


def memory_spec(text: str) -> int | str:
    """``"auto"`` (cache budget + the job's measured memory + the cached loader's reserve) or a size."""
    if text == "auto":
        return text
    value = size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a memory limit must be positive, got {text!r}")
    return value


def data_spec(text: str) -> Data:
    """An existing path (image folder, LMDB folder, Arrow/Parquet file), an image folder in object storage
    (``s3://bucket/prefix``, listed when the analysis starts) or a named generated workload."""
    try:
        data = parse_data(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if isinstance(data, NamedWorkload | ObjectData) or data.exists():
        return data
    raise argparse.ArgumentTypeError(
        f"no such data: {text!r} (give an image folder, an LMDB folder, an Arrow/Parquet file, "
        "or a generated workload: images, images:<count>, tokens, tokens:<count>)"
    )


def data_dir(text: str) -> Path:
    """A folder to generate workloads in: existing, or to be made where nothing but folders is in the way."""
    path = Path(text)
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        where = "" if blocker == path else f" (in the way of {text!r})"
        raise argparse.ArgumentTypeError(f"{str(blocker)!r} exists and is not a directory{where}")
    return path


def compute_spec(text: str) -> str:
    """A compute model name, checked now so a typo fails before any run."""
    from stallbench.compute import check_compute

    try:
        check_compute(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
