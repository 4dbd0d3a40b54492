"""An epoch's order as the group's first job drew it: ``order-<epoch>``, the batches' sample indices.

Layout (int64): the number of batches B, B + 1 offsets, then the indices back to back; checked on read.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from loader.system.private import open_private

__all__ = ["read_order", "write_order"]


def write_order(path: Path, batches: list[list[int]]) -> None:
    offsets = np.cumsum([0] + [len(b) for b in batches], dtype=np.int64)
    flat = np.fromiter((i for b in batches for i in b), dtype=np.int64, count=int(offsets[-1]))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(np.int64(len(batches)).tobytes() + offsets.tobytes() + flat.tobytes())


def read_order(path: Path, num_batches: int) -> list[list[int]]:
    fd = open_private(path.parent, path.name, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        raw = np.frombuffer(f.read(), dtype=np.int64)
    if (
        len(raw) < num_batches + 2
        or raw[0] != num_batches
        or raw[num_batches + 1] != len(raw) - num_batches - 2
    ):
        raise ValueError(f"the group's order file {path} is damaged")
    offsets, flat = raw[1 : num_batches + 2], raw[num_batches + 2 :]
    return [flat[offsets[b] : offsets[b + 1]].tolist() for b in range(num_batches)]
