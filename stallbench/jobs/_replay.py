"""What a run substitutes in the script's loading: the batches (``mode="ingestion"``) and the loader classes
(``loader="torch"`` or ``"cached"``).

Ingestion keeps a loader's first batches, made in the script's own process with no worker started, and hands
out a fresh copy of one of them for every later batch: the script's step runs on real batches while loading
costs next to nothing, which is the step alone. The copies matter: a script that edits its batch in place
would otherwise change the batches it is handed later.

A loader class is swapped by a stand-in class put where the script finds the original: calling it makes the
other loader, while ``isinstance`` and ``issubclass`` against it still answer for the class it replaced, and a
class the script derives from it is built as usual.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys
import weakref
from collections.abc import Callable
from typing import Any

from stallbench.jobs._fresh import fresh_copy
from stallbench.jobs._overrides import override_workers
from stallbench.jobs._timed import say
from stallbench.jobs.spec import JobSpec

__all__ = [
    "ReplayIterator",
    "cached_maker",
    "replay_length",
    "stand_in",
    "take_batches",
    "torch_maker",
]

OURS_ONLY = ("cache_bytes", "cache_dir", "on_error", "readahead")  # loader.DataLoader's own arguments


def take_batches(dl: Any, count: int) -> list[Any]:
    """``dl``'s first ``count`` batches (fewer if it has fewer), made in this process: ``num_workers`` is 0
    while torch's iterator is made, so no worker starts, and is restored before anything else sees it."""
    workers = dl.num_workers
    dl.num_workers = 0
    try:
        iterator = dl._get_iterator()
    finally:
        dl.num_workers = workers
    return list(itertools.islice(iterator, count))


def replay_length(dl: Any, steps: int | None, fallback: int, name: str) -> int:
    """Batches per ingestion epoch: what the pipeline would hand out (``steps``, capped by the loader's
    length); a loader without a length and no ``steps`` gets ``fallback``, with one line saying so."""
    try:
        length: int | None = len(dl)
    except TypeError:
        length = None
    if steps is not None:
        return steps if length is None else min(steps, length)
    if length is not None:
        return length
    say(f"{name} has no length and no steps was given: ingestion hands out {fallback} batches an epoch", name)
    return fallback


class ReplayIterator:
    """``length`` batches cycling over ``batches``, each a fresh copy."""

    def __init__(self, batches: list[Any], length: int) -> None:
        self._batches, self._length, self._next = batches, length if batches else 0, 0

    def __iter__(self) -> ReplayIterator:
        return self

    def __len__(self) -> int:
        return self._length

    def __next__(self) -> Any:
        if self._next >= self._length:
            raise StopIteration
        batch = self._batches[self._next % len(self._batches)]
        self._next += 1
        return fresh_copy(batch)


class _StandInMeta(type):
    """Calling the stand-in itself makes its ``_stallbench_make``'s object; a class derived from it is built
    and checked as any class is."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        make = cls.__dict__.get("_stallbench_make")
        if make is None:
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


def stand_in(original: type, make: Callable[..., Any]) -> type:
    """A class to put where the script finds ``original``: calling it returns ``make(*args, **kwargs)``."""
    namespace = {
        "_stallbench_make": staticmethod(make),
        "_stallbench_made": weakref.WeakSet(),
        "__module__": original.__module__,
        "__qualname__": original.__qualname__,
        "__doc__": original.__doc__,
    }
    cls = _StandInMeta(original.__name__, (original,), namespace)
    cls.__parameters__ = getattr(original, "__parameters__", ())  # DataLoader[T] still works
    return cls


def torch_maker(torch_class: type) -> Callable[..., Any]:
    """``loader.DataLoader(...)`` as a plain torch DataLoader: the same torch arguments, ours dropped."""

    def make(*args: Any, **kwargs: Any) -> Any:
        return torch_class(*args, **{k: v for k, v in kwargs.items() if k not in OURS_ONLY})

    return make


def cached_maker(spec: JobSpec, torch_class: type) -> Callable[..., Any]:
    """``torch.utils.data.DataLoader(...)`` as a ``loader.DataLoader``, cached when its Dataset is one of
    ours (``stallbench.jobs.served`` serves any other Dataset's file reads through the cache)."""

    def make(*args: Any, **kwargs: Any) -> Any:
        try:
            from loader import DataLoader, SourceDataset
        except Exception as exc:
            say(f"cannot import loader ({exc!r}); the DataLoaders stay torch's", key="import-loader")
            return torch_class(*args, **kwargs)
        dataset = args[0] if args else kwargs.get("dataset")
        extra: dict[str, Any] = {}
        if isinstance(dataset, SourceDataset):
            extra["cache_bytes"] = spec.cache_bytes if spec.cache_bytes is not None else "auto"
            if spec.cache_dir is not None:
                extra["cache_dir"] = spec.cache_dir
        try:
            return DataLoader(*args, **kwargs, **extra)
        except TypeError as exc:
            say(f"loader.DataLoader does not take these arguments ({exc}); using torch's", key="cached-args")
            return torch_class(*args, **kwargs)

    return make


_TORCH, _OURS = "torch.utils.data.dataloader", "loader.dataloader"
_Hook = tuple[Callable[[], None] | None, Callable[[Any], None]]  # (before, after) the module's code runs


def install_hooks(spec: JobSpec, iterate: Callable[[Any, Callable[[Any], Any]], Any]) -> None:
    """Patch ``DataLoader.__iter__`` (to ``iterate(loader, original)``) and swap the loader classes as
    ``spec.loader`` asks, each right after its module is imported (now, for one imported already)."""
    originals: dict[str, type] = {}
    swapped: dict[str, type] = {}

    def torch_imported(module: Any) -> None:
        cls = originals[_TORCH] = module.DataLoader
        _patch_iter(cls, iterate)
        override_workers(cls, spec)
        if spec.loader == "cached":
            swapped[_TORCH] = stand_in(cls, cached_maker(spec, cls))
            _set_class(_TORCH, swapped[_TORCH])

    def ours_imported(module: Any) -> None:
        override_workers(module.DataLoader, spec)
        if spec.loader == "torch":
            torch_class = originals.get(_TORCH) or sys.modules[_TORCH].DataLoader
            _set_class(_OURS, stand_in(module.DataLoader, torch_maker(torch_class)))
        elif _TORCH in swapped:  # cached: loader.DataLoader derives from torch's own class, as ever
            _set_class(_TORCH, swapped[_TORCH])

    def ours_importing() -> None:
        if _TORCH in swapped:
            _set_class(_TORCH, originals[_TORCH])

    hooks: dict[str, _Hook] = {_TORCH: (None, torch_imported)}
    if spec.loader != "as-is" or spec.workers is not None or spec.prefetch_factor is not None:
        hooks[_OURS] = (ours_importing, ours_imported)
    sys.meta_path.insert(0, _PostImport(hooks))
    for name, (_, after) in hooks.items():
        if name in sys.modules:
            _guarded(after, sys.modules[name])


def _patch_iter(cls: type, iterate: Callable[[Any, Callable[[Any], Any]], Any]) -> None:
    original = cls.__dict__["__iter__"]
    if getattr(original, "__stallbench__", False):
        return

    @functools.wraps(original)
    def __iter__(self: Any) -> Any:
        return iterate(self, original)

    __iter__.__stallbench__ = True  # type: ignore[attr-defined]
    cls.__iter__ = __iter__  # type: ignore[method-assign]


def _set_class(module_name: str, cls: type) -> None:
    """``DataLoader`` in the module and in its package: the package's own import of it, if still to come,
    then takes ``cls`` too."""
    for name in (module_name, module_name.rpartition(".")[0]):
        module = sys.modules.get(name)
        if module is not None:
            module.DataLoader = cls


def _guarded(hook: Callable[..., None], *args: Any) -> None:
    try:
        hook(*args)
    except Exception as exc:
        say(f"patching DataLoader failed ({exc!r}); the command runs on, unmeasured or unswapped")


class _PostImport:
    """A ``sys.meta_path`` finder for a few modules only: it finds them as the other finders would and wraps
    their loader so that ``before`` runs just before the module's code and ``after`` just after it."""

    def __init__(self, hooks: dict[str, _Hook]) -> None:
        self._hooks = dict(hooks)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self._hooks:
            return None
        try:
            spec = self._others(fullname, path, target)
            if spec is None or not hasattr(spec.loader, "exec_module"):
                return None
            spec.loader = _HookedLoader(spec.loader, *self._hooks.pop(fullname))
            return spec
        except Exception as exc:
            say(f"cannot hook the import of {fullname} ({exc!r})")
            return None

    def _others(self, fullname: str, path: Any, target: Any) -> Any:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                return spec
        return None


class _HookedLoader:
    """The module's own loader, with the hooks around its ``exec_module``; anything else is the loader's."""

    def __init__(self, loader: Any, before: Callable[[], None] | None, after: Callable[[Any], None]) -> None:
        self._loader, self._before, self._after = loader, before, after

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        if self._before is not None:
            _guarded(self._before)
        self._loader.exec_module(module)
        _guarded(self._after, module)

    def __getattr__(self, name: str) -> Any:
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)
