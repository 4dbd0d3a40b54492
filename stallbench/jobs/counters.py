"""``loader.system.counters`` (the kernel's counts of a process tree) for the bootstrap in a user's command,
loaded from its file under a name of ours, the one module stallbench loads by path.

The bootstrap runs in the user's process before the script's own imports. Importing ``loader.system``
would put a module named ``loader`` into ``sys.modules`` there, and a project with a ``loader.py`` of its own
(a common name) would then import ours in its place. The counters import only the standard library, so the
file is loaded alone; every other process of stallbench imports the loader's modules by name.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

__all__ = ["cpu_seconds", "storage_read_bytes"]

_NAME = "_stallbench_kernel_counters"


def _counters() -> ModuleType:
    if _NAME not in sys.modules:
        found = importlib.util.find_spec("loader")  # finds the package, does not import it
        if found is None or not found.submodule_search_locations:
            raise ImportError("the loader package is not installed beside stallbench")
        path = f"{found.submodule_search_locations[0]}/system/counters.py"
        spec = importlib.util.spec_from_file_location(_NAME, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module  # a dataclass looks its module up while it is made
        spec.loader.exec_module(module)
    return sys.modules[_NAME]


cpu_seconds = _counters().cpu_seconds
storage_read_bytes = _counters().storage_read_bytes
