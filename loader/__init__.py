"""A drop-in PyTorch DataLoader with a shared minimal-miss cache: change one import, add a cache size.

Every name comes from its module when first named (PEP 562), so ``import loader`` loads neither torch nor
pyarrow nor lmdb until a name that needs them is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader._lazy import lazy_names

if TYPE_CHECKING:
    from loader.cache import CacheInfo, MinIOCache
    from loader.coordinated import Coordination, CoordinationStats, CoordinationWarning, PrepFailed
    from loader.dataloader import DataLoader
    from loader.datasets import SKIPPED, ArrowDataset, ImageFolder, LMDBDataset, SourceDataset, TarShards
    from loader.errors import BadRecordError, SourceError
    from loader.fetching.decode import EvalTransform, TrainTransform
    from loader.fetching.pil import PilBuild, pil_build
    from loader.fetching.staged import Staged, StagedTransform
    from loader.partition import Partition
    from loader.serving.files import CachedFiles
    from loader.sources import FileTreeSource, ImageFolderSource, Source, TarShardsSource
    from loader.stats.loader_stats import LoaderStats

# Each name is imported from its module when first used: ``import loader`` alone (or of ``loader.system``,
# ``loader.sources``) loads neither torch nor pyarrow nor lmdb, so a process that only sizes or lists data
# (stallbench's own) starts 1.5 s sooner.
_HOMES = {
    "PilBuild": "loader.fetching.pil",
    "pil_build": "loader.fetching.pil",
    "CacheInfo": "loader.cache",
    "MinIOCache": "loader.cache",
    "Coordination": "loader.coordinated",
    "CoordinationStats": "loader.coordinated",
    "CoordinationWarning": "loader.coordinated",
    "PrepFailed": "loader.coordinated",
    "DataLoader": "loader.dataloader",
    "SKIPPED": "loader.datasets",
    "ArrowDataset": "loader.datasets",
    "ImageFolder": "loader.datasets",
    "LMDBDataset": "loader.datasets",
    "SourceDataset": "loader.datasets",
    "TarShards": "loader.datasets",
    "EvalTransform": "loader.fetching.decode",
    "TrainTransform": "loader.fetching.decode",
    "BadRecordError": "loader.errors",
    "SourceError": "loader.errors",
    "CachedFiles": "loader.serving.files",
    "Partition": "loader.partition",
    "ArrowSource": "loader.sources",
    "FileTreeSource": "loader.sources",
    "HFDatasetSource": "loader.sources",
    "ImageFolderSource": "loader.sources",
    "LMDBSource": "loader.sources",
    "Source": "loader.sources",
    "TarShardsSource": "loader.sources",
    "image_folder_to_lmdb": "loader.sources",
    "Staged": "loader.fetching.staged",
    "StagedTransform": "loader.fetching.staged",
    "LoaderStats": "loader.stats.loader_stats",
}

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


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
