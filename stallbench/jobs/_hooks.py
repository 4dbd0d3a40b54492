"""What a run changes in the script's loading, each change made right after the module it changes is
imported (a ``sys.meta_path`` hook), so a process that never imports torch pays nothing and a swapped class
is in place before the script's own ``from torch.utils.data import DataLoader``: ``DataLoader.__iter__``
(and every subclass's own) calls the measuring side, ``__len__`` says at most ``steps``, the classes are
swapped as the spec asks (``stallbench.jobs._swap``), checkpoint writes and compilations are timed
(``stallbench.jobs._transitions``), and so is each sample's prep (``stallbench.jobs._sample_times``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from stallbench.jobs._overrides import override_arguments
from stallbench.jobs._sample_times import time_samples
from stallbench.jobs._swap import cached_class, cached_maker, stand_in, torch_taking_ours
from stallbench.jobs._timed import say
from stallbench.jobs._transitions import watched_modules
from stallbench.jobs.spec import JobSpec

__all__ = ["WRAPPERS", "Iterate", "install_hooks"]

Iterate = Callable[[Any, Callable[[Any], Any], Callable[..., Any], bool], Any]

_TORCH, _OURS = "torch.utils.data.dataloader", "loader.dataloader"
# Frameworks' wrappers around a DataLoader, timed as the loader the script iterates: the work they do per
# batch (accelerate's look-ahead, its moving each batch to the device) is waiting, as the script sees it
WRAPPERS = {"accelerate.data_loader": ("DataLoaderShard", "DataLoaderDispatcher", "SkipDataLoader")}
_Hook = tuple[Callable[[], None] | None, Callable[[Any], None]]  # (before, after) the module's code runs


def install_hooks(spec: JobSpec, iterate: Iterate) -> None:
    """Patch ``DataLoader.__iter__`` (to ``iterate(loader, original, layer, source)``), its subclasses' and
    the known wrappers' own, and swap the loader classes as ``spec.loader`` asks, each right after its module
    is imported (now, for one imported already)."""
    originals: dict[str, type] = {}
    swapped: dict[str, type] = {}
    ours_importing_now = []  # loader.dataloader is being executed: its class must derive from torch's own
    cached = functools.cache(functools.partial(cached_class, spec))  # one class for the whole run

    def torch_imported(module: Any) -> None:
        time_samples(sys.modules["torch.utils.data._utils.fetch"], spec.out_dir)
        cls = originals[_TORCH] = module.DataLoader
        _patch_iter(cls, iterate, source=True)
        _patch_len(cls, spec.steps)
        _hook_subclasses(cls, iterate, spec.steps)
        override_arguments(cls, spec)
        if spec.loader == "cached":
            swapped[_TORCH] = stand_in(cls, cached_maker(cached, cls), cached)
            if not ours_importing_now:  # else ours_imported puts it in place once ours is made
                _set_class(_TORCH, swapped[_TORCH])

    def ours_imported(module: Any) -> None:
        ours_importing_now.clear()
        override_arguments(module.DataLoader, spec)
        if spec.loader == "torch":
            torch_class = originals.get(_TORCH) or sys.modules[_TORCH].DataLoader
            make, plain = torch_taking_ours(torch_class, module.DataLoader)
            _set_class(_OURS, stand_in(module.DataLoader, make, lambda: plain))
        elif _TORCH in swapped:  # cached: loader.DataLoader derives from torch's own class, as ever
            _set_class(_TORCH, swapped[_TORCH])

    def ours_importing() -> None:
        ours_importing_now.append(True)  # torch's module may first be imported by ours, below
        if _TORCH in swapped:
            _set_class(_TORCH, originals[_TORCH])

    def wrappers_imported(module: Any) -> None:
        for name in WRAPPERS[module.__name__]:
            wrapper = getattr(module, name, None)
            if isinstance(wrapper, type) and "__iter__" in vars(wrapper):
                _patch_iter(wrapper, iterate, source=False)

    hooks: dict[str, _Hook] = {_TORCH: (None, torch_imported)}
    hooks |= dict.fromkeys(WRAPPERS, (None, wrappers_imported))
    hooks |= {name: (None, hook) for name, hook in watched_modules().items()}
    if spec.loader != "as-is" or spec.overrides:
        hooks[_OURS] = (ours_importing, ours_imported)
    sys.meta_path.insert(0, _PostImport(hooks))
    for name, (_, after) in hooks.items():
        if name in sys.modules:
            _guarded(after, sys.modules[name])


def _hook_subclasses(cls: type, iterate: Iterate, steps: int | None) -> None:
    """Every class derived from ``cls`` from now on gets its own ``__iter__`` and ``__len__`` patched too."""

    def __init_subclass__(sub: type, **kwargs: Any) -> None:
        super(cls, sub).__init_subclass__(**kwargs)  # type: ignore[misc]  # typing.Generic's
        if "__iter__" in sub.__dict__:
            _guarded(_patch_iter, sub, iterate, False)
        if "__len__" in sub.__dict__:
            _guarded(_patch_len, sub, steps)

    cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]


def _patch_iter(cls: type, iterate: Iterate, source: bool) -> None:
    """``cls.__iter__`` calls ``iterate(loader, original, layer, source)``; ``source``: torch's own."""
    original = cls.__dict__["__iter__"]
    if getattr(original, "__stallbench__", False):
        return

    @functools.wraps(original)
    def __iter__(self: Any) -> Any:
        return iterate(self, original, __iter__, source)

    __iter__.__stallbench__ = True  # type: ignore[attr-defined]
    cls.__iter__ = __iter__  # type: ignore[method-assign]


def _patch_len(cls: type, steps: int | None) -> None:
    """With ``steps``, ``len(loader)`` says at most ``steps``: a loop that stops at ``len()`` (Lightning)
    then ends its epoch there as it ends any, validation and all."""
    original = cls.__dict__["__len__"]
    if steps is None or getattr(original, "__stallbench__", False):
        return

    @functools.wraps(original)
    def __len__(self: Any) -> int:
        return min(original(self), steps)

    __len__.__stallbench__ = True  # type: ignore[attr-defined]
    cls.__len__ = __len__  # type: ignore[method-assign]


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
