"""``loader.system.counters`` (the kernel's counts of a process tree), loaded alone from its file.

Importing it as ``loader.system.counters`` runs ``loader/__init__.py``, which brings torch, pyarrow and lmdb:
the bootstrap would load them into every process of a script that never uses them, before the script's own
imports, and the command line would start with torch. The module imports only the standard library, so it is
loaded here on its own, found without importing ``loader``. ``PATH`` is its file, for a child that does the
same (the storage reader of ``stallbench.analysis.measure``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = ["PATH", "cpu_seconds", "storage_read_bytes"]


def _path() -> Path:
    found = importlib.util.find_spec("loader")  # finds the package, does not import it
    if found is None or found.origin is None:
        raise ImportError("the loader package is not installed beside stallbench")
    return Path(found.origin).parent / "system" / "counters.py"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_stallbench_counters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PATH = _path()
_counters = _load(PATH)
cpu_seconds = _counters.cpu_seconds
storage_read_bytes = _counters.storage_read_bytes
