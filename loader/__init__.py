"""A drop-in PyTorch DataLoader with a shared minimal-miss cache: change one import, add a cache size.

``ArrowSource``, ``HFDatasetSource``, ``LMDBSource`` and ``image_folder_to_lmdb`` come from ``loader.sources``
when first named, so ``import loader`` loads neither pyarrow nor lmdb.
"""

from typing import Any

from loader._pil import PilBuild, pil_build
from loader.cache import CacheInfo, MinIOCache
from loader.coordinated import Coordination, CoordinationStats, CoordinationWarning, PrepFailed
from loader.dataloader import DataLoader
from loader.datasets import SKIPPED, ArrowDataset, ImageFolder, LMDBDataset, SourceDataset, TarShards
from loader.decode import EvalTransform, TrainTransform
from loader.errors import BadRecordError, SourceError
from loader.files import CachedFiles
from loader.partition import Partition
from loader.sources import FileTreeSource, ImageFolderSource, Source, TarShardsSource
from loader.staged import Staged, StagedTransform
from loader.stats import LoaderStats

__all__ = [
    "SKIPPED",
    "ArrowDataset",
    "ArrowSource",
    "BadRecordError",
    "CachedFiles",
    "CacheInfo",
    "Coordination",
    "CoordinationStats",
    "CoordinationWarning",
    "DataLoader",
    "EvalTransform",
    "FileTreeSource",
    "HFDatasetSource",
    "ImageFolder",
    "ImageFolderSource",
    "LMDBDataset",
    "LMDBSource",
    "LoaderStats",
    "MinIOCache",
    "Partition",
    "PilBuild",
    "PrepFailed",
    "SourceDataset",
    "SourceError",
    "Staged",
    "StagedTransform",
    "Source",
    "TarShards",
    "TarShardsSource",
    "TrainTransform",
    "image_folder_to_lmdb",
    "pil_build",
]


def __getattr__(name: str) -> Any:
    if name in ("ArrowSource", "HFDatasetSource", "LMDBSource", "image_folder_to_lmdb"):
        from loader import sources

        return getattr(sources, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
