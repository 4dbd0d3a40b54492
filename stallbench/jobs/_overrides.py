"""What a run changes in the DataLoaders the script builds: ``--apply``'s advised ``num_workers`` /
``prefetch_factor`` for every DataLoader, its ``cache_form`` for every ``loader.DataLoader``; and the run's
own ``cache_dir`` for every ``loader.DataLoader``, whatever folder the script named: each run's store is
fresh and private to it (the cold run's cache starts empty, as the method says), and no run reads or fills
the store the user's own jobs share.

Set at construction, not later: ``loader.DataLoader`` sizes its shared counters by its workers and opens its
store when it is made. Both classes' ``__init__`` are wrapped (ours calls torch's: the same values twice,
harmlessly); a class whose ``__init__`` does not take ``cache_form`` or ``cache_dir`` (torch's) is not given
them.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from stallbench.jobs.spec import JobSpec

__all__ = ["override_arguments"]


def override_arguments(cls: type, spec: JobSpec) -> None:
    """Wrap ``cls.__init__`` so that ``spec.workers``, ``spec.prefetch_factor``, ``spec.cache_form`` and
    ``spec.cache_dir`` replace the script's."""
    if not spec.overrides:
        return
    original = cls.__dict__["__init__"]
    if getattr(original, "__stallbench__", False):
        return
    signature = inspect.signature(original)
    ours = {"cache_form": spec.cache_form, "cache_dir": spec.cache_dir}
    ours = {k: v for k, v in ours.items() if v is not None and k in signature.parameters}

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        _apply(bound.arguments, spec)
        bound.arguments.update(ours)
        original(*bound.args, **bound.kwargs)

    __init__.__stallbench__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def _apply(arguments: dict[str, Any], spec: JobSpec) -> None:
    if spec.workers is None and spec.prefetch_factor is None:
        return
    workers = spec.workers if spec.workers is not None else arguments.get("num_workers", 0)
    arguments["num_workers"] = workers
    if workers == 0:  # torch refuses both without workers
        arguments["prefetch_factor"] = None
        arguments["persistent_workers"] = False
    elif spec.prefetch_factor is not None:
        arguments["prefetch_factor"] = spec.prefetch_factor
