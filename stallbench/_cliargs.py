"""argparse ``type=`` parsers: each names what it could not read, and argparse turns that into exit code 2."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from stallbench.storage import parse_size

__all__ = [
    "CacheSpec",
    "bandwidth",
    "cache_spec",
    "compute_spec",
    "data_spec",
    "memory_spec",
    "positive_int",
    "size",
]

_NAMED = re.compile(r"^(images|tokens)(?::(\d+))?$")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def size(text: str) -> int:
    """``"1.5G"``, ``"300MB"``, ``"12000"`` -> bytes."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bandwidth(text: str) -> int:
    """``"200MB/s"`` or ``"200MB"`` -> bytes per second (must be positive)."""
    value = size(text[:-2] if text.endswith("/s") else text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a bandwidth must be positive, got {text!r}")
    return value


class CacheSpec(float):
    """A cache size given as a fraction of the dataset (``"50%"``); resolved once the dataset is known."""


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
    """``"auto"`` (cache budget + the job's measured memory) or a size."""
    if text == "auto":
        return text
    value = size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a memory limit must be positive, got {text!r}")
    return value


def data_spec(text: str) -> str:
    """An existing path (image folder, LMDB folder, Arrow/Parquet file) or a named generated workload."""
    if _NAMED.match(text) or Path(text).exists():
        return text
    raise argparse.ArgumentTypeError(
        f"no such data: {text!r} (give an image folder, an LMDB folder, an Arrow/Parquet file, "
        "or a generated workload: images, images:<count>, tokens, tokens:<count>)"
    )


def compute_spec(text: str) -> str:
    """A compute model name, checked now so a typo fails before any run."""
    from stallbench.compute import parse_compute

    try:
        parse_compute(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def named_workload(text: str) -> tuple[str, int | None] | None:
    """``("images", 48)`` for ``"images:48"``; None for a path."""
    match = _NAMED.match(text)
    return (match.group(1), int(match.group(2)) if match.group(2) else None) if match else None
