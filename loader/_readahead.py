"""Read-ahead inside a worker: a batch's raw records are fetched on a few threads while the worker decodes.

Storage and cache reads release the GIL, so a worker no longer sits idle on I/O between two decodes: with
fetch no slower than prep, the fetch time hides behind the decode.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["ReadAhead"]


class ReadAhead:
    """A thread pool per process (made lazily, so each forked or spawned worker has its own)."""

    def __init__(self, threads: int) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"readahead must be a positive number of threads, got {threads!r}")
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1

    def submit_all(self, fetch: Callable[[int], Any], indices: Sequence[int]) -> list[Future]:
        """Start ``fetch(i)`` for every index; the futures come back in the same order."""
        if self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="stallbench-readahead")
            self._pid = os.getpid()
        return [self._pool.submit(fetch, i) for i in indices]

    def __getstate__(self) -> dict:
        return {"threads": self.threads, "_pool": None, "_pid": -1}
