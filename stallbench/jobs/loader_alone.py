"""Modules of ``loader`` that import only the standard library, loaded alone from their files.

Importing one as ``loader.<name>`` runs ``loader/__init__.py``, which brings torch, pyarrow and lmdb: the
bootstrap would load them into every process of a script that never uses them, before the script's own
imports, and the command line would start with torch. So the few such modules stallbench's own processes
use (the kernel's counters, the partitioned cache's split rule) are loaded here on their own, found without
importing ``loader``; a module's ``__file__`` gives a child that does the same its file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_alone"]


def _path(relative: str) -> Path:
    """The file of ``loader/<relative>``."""
    found = importlib.util.find_spec("loader")  # finds the package, does not import it
    if found is None or found.origin is None:
        raise ImportError("the loader package is not installed beside stallbench")
    return Path(found.origin).parent / relative


def load_alone(relative: str) -> ModuleType:
    """``loader/<relative>`` as a module of its own (once per process, under a name of ours)."""
    name = "_stallbench_" + relative.removesuffix(".py").replace("/", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _path(relative))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a dataclass looks its module up while it is made
        spec.loader.exec_module(module)
    return sys.modules[name]
