"""``--apply``: every DataLoader the script builds gets the advised ``num_workers`` / ``prefetch_factor``.

Set at construction, not later: ``loader.DataLoader`` sizes its shared counters by its workers when it is
made. Both classes' ``__init__`` are wrapped (ours calls torch's: the same values twice, harmlessly).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from stallbench.jobs.spec import JobSpec

__all__ = ["override_workers"]


def override_workers(cls: type, spec: JobSpec) -> None:
    """Wrap ``cls.__init__`` so that ``spec.workers`` and ``spec.prefetch_factor`` replace the script's."""
    if spec.workers is None and spec.prefetch_factor is None:
        return
    original = cls.__dict__["__init__"]
    if getattr(original, "__stallbench__", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        _apply(bound.arguments, spec)
        original(*bound.args, **bound.kwargs)

    __init__.__stallbench__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def _apply(arguments: dict[str, Any], spec: JobSpec) -> None:
    workers = spec.workers if spec.workers is not None else arguments.get("num_workers", 0)
    arguments["num_workers"] = workers
    if workers == 0:  # torch refuses both without workers
        arguments["prefetch_factor"] = None
        arguments["persistent_workers"] = False
    elif spec.prefetch_factor is not None:
        arguments["prefetch_factor"] = spec.prefetch_factor
