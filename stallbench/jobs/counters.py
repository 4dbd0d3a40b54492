"""``loader.system.counters`` (the kernel's counts of a process tree), loaded alone from its file
(``stallbench.jobs.loader_alone``: importing ``loader`` would bring torch into every process)."""

from __future__ import annotations

from pathlib import Path

from stallbench.jobs.loader_alone import load_alone

__all__ = ["PATH", "cpu_seconds", "storage_read_bytes"]

_counters = load_alone("system/counters.py")
PATH = Path(_counters.__file__)  # for a child that loads it alone too (the storage reader)
cpu_seconds = _counters.cpu_seconds
storage_read_bytes = _counters.storage_read_bytes
