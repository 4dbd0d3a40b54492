"""The loader classes a run swaps (``loader="torch"`` or ``"cached"``): a stand-in class put where the script
finds the original, calling it makes the other loader, while ``isinstance`` and ``issubclass`` against it
still answer for the class it replaced. A class the script derives from it (``class MyLoader(DataLoader)``)
is built on the other loader instead, and one line says so when the script first makes one: a framework's
module defines such classes on import (accelerate's, Lightning's) that the script may never build.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable
from typing import Any

from stallbench.jobs._timed import say
from stallbench.jobs.spec import JobSpec

__all__ = ["cached_class", "cached_maker", "ours_only", "stand_in", "torch_taking_ours"]


def ours_only(ours: type, torch_class: type) -> frozenset[str]:
    """The arguments ``loader.DataLoader`` takes beyond torch's, read from both signatures."""
    own = inspect.signature(ours.__init__).parameters
    return frozenset(own) - frozenset(inspect.signature(torch_class.__init__).parameters)


class _StandInMeta(type):
    """Calling the stand-in itself makes its ``_stallbench_make``'s object; a class derived from it is built
    on the stand-in's ``_stallbench_base()`` (the other loader's class) and checked as any class is."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> Any:
        rebased = [_rebased(name, b) for b in bases]
        if lines := [line for _, line in rebased if line]:
            namespace["_stallbench_rebased"] = lines
        return super().__new__(mcls, name, tuple(base for base, _ in rebased), namespace, **kwargs)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        make = cls.__dict__.get("_stallbench_make")
        if make is None:
            _say_rebased(cls)
            return super().__call__(*args, **kwargs)
        made = make(*args, **kwargs)
        with contextlib.suppress(TypeError):  # not weakly referable: isinstance asks its class alone
            cls._stallbench_made.add(made)
        return made

    def __instancecheck__(cls, obj: Any) -> bool:
        if "_stallbench_make" not in cls.__dict__:
            return super().__instancecheck__(obj)
        try:
            made = obj in cls._stallbench_made
        except TypeError:
            made = False
        return made or isinstance(obj, cls.__bases__[0])

    def __subclasscheck__(cls, sub: type) -> bool:
        if "_stallbench_make" not in cls.__dict__:
            return super().__subclasscheck__(sub)
        return issubclass(sub, cls.__bases__[0])


def _rebased(name: str, base: type) -> tuple[type, str | None]:
    """The class a script's class derives from in place of the stand-in ``base`` (``base`` itself for any
    other class, or where the other loader's class cannot be had), and the line to say when the script's
    class is first built (None: nothing to say)."""
    other = base.__dict__.get("_stallbench_base") if isinstance(base, _StandInMeta) else None
    if other is None:
        return base, None
    original = f"{base.__module__}.{base.__qualname__}"
    try:
        cls = other()
    except Exception as exc:
        return base, f"{name} derives from {original} and stays on it in this run ({exc!r})"
    return cls, f"{name} derives from {original}: in this run it is built on {cls.__module__}.DataLoader"


def _say_rebased(cls: type) -> None:
    """Say, once each, the lines of ``cls`` and the classes it derives from that were rebased: the script
    builds one now."""
    for klass in cls.__mro__:
        for line in klass.__dict__.get("_stallbench_rebased", ()):
            say(line, key=line)


def stand_in(original: type, make: Callable[..., Any], base: Callable[[], type]) -> type:
    """A class to put where the script finds ``original``: calling it returns ``make(*args, **kwargs)``; a
    class derived from it derives from ``base()`` instead."""
    namespace = {
        "_stallbench_make": staticmethod(make),
        "_stallbench_base": staticmethod(base),
        "_stallbench_made": weakref.WeakSet(),
        "__module__": original.__module__,
        "__qualname__": original.__qualname__,
        "__doc__": original.__doc__,
    }
    cls = _StandInMeta(original.__name__, (original,), namespace)
    cls.__parameters__ = getattr(original, "__parameters__", ())  # DataLoader[T] still works
    return cls


def torch_taking_ours(torch_class: type, ours: type) -> tuple[Callable[..., Any], type]:
    """Torch's DataLoader as ``loader.DataLoader`` is called, the same torch arguments and ours dropped: a
    maker of torch's own loaders, and a class for the script's classes to derive from."""
    dropped = ours_only(ours, torch_class)

    def make(*args: Any, **kwargs: Any) -> Any:
        return torch_class(*args, **{k: v for k, v in kwargs.items() if k not in dropped})

    class DataLoader(torch_class):  # type: ignore[misc, valid-type]
        __module__, __qualname__ = torch_class.__module__, torch_class.__qualname__

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{k: v for k, v in kwargs.items() if k not in dropped})

    return make, DataLoader


def cached_maker(cached: Callable[[], type], torch_class: type) -> Callable[..., Any]:
    """``torch.utils.data.DataLoader(...)`` as the class ``cached()`` makes it; torch's own where ``loader``
    cannot be imported or does not take the arguments (one line says why)."""

    def make(*args: Any, **kwargs: Any) -> Any:
        try:
            cls = cached()
        except Exception as exc:
            say(f"cannot import loader ({exc!r}); the DataLoaders stay torch's", key="import-loader")
            return torch_class(*args, **kwargs)
        try:
            return cls(*args, **kwargs)
        except TypeError as exc:
            say(f"loader.DataLoader does not take these arguments ({exc}); using torch's", key="cached-args")
            return torch_class(*args, **kwargs)

    return make


def cached_class(spec: JobSpec) -> type:
    """``loader.DataLoader`` with this run's cache (its folder is the run's, ``_overrides``), the script's
    own arguments first: ``cache_bytes`` for one of our datasets; for any other Dataset, ``cache_files`` on
    the data roots, so the files it opens itself are read through the cache, as a user does with the same
    arguments. Where our loader refuses those (a cache too small for the files' index), one line says so
    and it is made without them: a measurement never stops the script."""
    from loader import DataLoader, SourceDataset

    class CachedDataLoader(DataLoader):  # type: ignore[misc, valid-type]
        __module__, __qualname__ = DataLoader.__module__, DataLoader.__qualname__

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            dataset = args[0] if args else kwargs.get("dataset")
            mine = isinstance(dataset, SourceDataset)
            extra: dict[str, Any] = {}
            if mine or (spec.data and spec.cache_bytes is not None and spec.mode != "ingestion"):
                extra["cache_bytes"] = spec.cache_bytes if spec.cache_bytes is not None else "auto"
            if not mine and extra:
                extra["cache_files"] = list(spec.data)
            try:
                super().__init__(*args, **{**extra, **kwargs})
            except ValueError as exc:  # the run's cache, not the script, is at fault: go on without it
                if not extra:
                    raise
                say(f"loader.DataLoader refused this run's cache ({exc}); it reads without one", key="cache")
                super().__init__(*args, **kwargs)

    CachedDataLoader.__name__ = DataLoader.__name__
    return CachedDataLoader
