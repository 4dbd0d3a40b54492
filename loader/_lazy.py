"""A package's names imported from their modules when first used (PEP 562), for loader's faces: importing
``loader``, ``loader.system``, ``loader.sources`` or ``loader.instrument`` loads none of the modules behind
them, so a process that only sizes data, counts a process tree or asks where data lives starts without
torch, pyarrow or lmdb."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: dict[str, str], names: dict[str, Any], exported: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (its ``globals()``: ``names``): each name of
    ``homes`` from the module it maps to, imported at its first use and kept in the package from then on."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        names[name] = value  # once: later uses find it here
        return value

    def __dir__() -> list[str]:
        return sorted({*names, *exported})

    return __getattr__, __dir__
