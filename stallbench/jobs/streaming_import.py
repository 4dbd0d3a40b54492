"""MosaicML Streaming, imported where torchvision cannot be.

``import streaming`` imports ``streaming.vision`` (its ImageNet and CIFAR datasets), which imports three
names of torchvision at its top: ``VisionDataset``, ``CIFAR10`` and ``to_tensor``. torchvision's wheels do not
import beside the CPU torch we pin, and the loader stallbench runs (``StreamingDataset`` over MDS shards of
bytes and labels) uses none of the three. So where torchvision does not import, the import of Streaming
sees a stand-in for those three names, each raising ImportError if it is ever called, and the stand-in is
taken away again once Streaming is imported: nothing else in the process sees a torchvision. transformers
(which Streaming imports, and which asks at its own import whether torchvision is there) is imported first,
so it answers without the stand-in. The report says so in its notes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["STAND_IN_NOTE", "needs_stand_in", "streaming"]

STAND_IN_NOTE = (
    "MosaicML Streaming ran with a stand-in for torchvision, which does not import beside this torch: its "
    "image datasets import three torchvision names that its StreamingDataset over MDS shards never calls."
)
_NAMES = (
    "torchvision",
    "torchvision.datasets",
    "torchvision.transforms",
    "torchvision.transforms.functional",
)


def _not_installed(*args: Any, **kwargs: Any) -> None:
    raise ImportError(
        "torchvision does not import here: stallbench imported Streaming with a stand-in for it"
    )


class _VisionDataset:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _not_installed()


@functools.cache
def needs_stand_in() -> bool:
    """Whether torchvision does not import here, so Streaming is imported with the stand-in."""
    return not _torchvision_imports()


def _torchvision_imports() -> bool:
    try:
        importlib.import_module("torchvision")  # asked, not needed: no dependency of ours
    except Exception:  # a build that does not match torch fails with more than ImportError
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        return False
    return True


@contextlib.contextmanager
def _stand_in() -> Iterator[None]:
    modules = {name: types.ModuleType(name) for name in _NAMES}
    tv, datasets, transforms, functional = modules.values()
    datasets.VisionDataset, datasets.CIFAR10 = _VisionDataset, _VisionDataset
    functional.to_tensor = _not_installed
    tv.datasets, tv.transforms, transforms.functional = datasets, transforms, functional
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in modules.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


@functools.cache
def streaming() -> types.ModuleType:
    """The ``streaming`` package; ImportError where it is not installed."""
    if "streaming" in sys.modules or not needs_stand_in():
        import streaming as package

        return package
    import transformers  # noqa: F401  (it asks for torchvision at its import: before the stand-in)

    with _stand_in():
        import streaming as package
    return package
