"""A job killed while its workers have batches to send: ``_orphan_job.py`` prints its workers' pids once it
has its first batch, then waits to be killed. Each record is 64 kB of raw bytes, so every batch travels
whole through the result pipe and a few fill it: the workers cannot send what they made once no one reads."""

from __future__ import annotations

import sys
import time

import psutil
from helpers import MemorySource

from loader import DataLoader, SourceDataset

if __name__ == "__main__":
    dl = DataLoader(
        SourceDataset(MemorySource(400, 64 << 10)), batch_size=4, num_workers=2, prefetch_factor=16
    )
    it = iter(dl)
    next(it)
    time.sleep(1.0)  # the workers fill the pipe
    print(" ".join(str(p.pid) for p in psutil.Process().children()), flush=True)
    sys.stdin.read()  # until killed
