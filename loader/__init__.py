"""A drop-in PyTorch DataLoader with a shared minimal-miss cache: change one import, add a cache size."""

from loader._pil import PilBuild, pil_build
from loader.cache import CacheInfo, MinIOCache
from loader.coordinated import Coordination, CoordinationStats, CoordinationWarning, PrepFailed
from loader.dataloader import DataLoader
from loader.datasets import SKIPPED, ArrowDataset, ImageFolder, LMDBDataset, SourceDataset
from loader.decode import EvalTransform, TrainTransform
from loader.errors import BadRecordError, SourceError
from loader.files import CachedFiles
from loader.partition import Partition
from loader.sources import (
    ArrowSource,
    FileTreeSource,
    ImageFolderSource,
    LMDBSource,
    Source,
    image_folder_to_lmdb,
)
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
    "Source",
    "TrainTransform",
    "image_folder_to_lmdb",
    "pil_build",
]
