"""Data sources: index -> raw record bytes, from an image folder, WebDataset tar shards, an LMDB, an Arrow
IPC / Parquet file, or a Hugging Face dataset saved to disk; an image folder in object storage (s3://).

Every source (and the converters) is imported when first named: a process whose data is an image folder
never loads pyarrow, lmdb or boto3 (pyarrow and lmdb: about 44 MB of memory in each worker), and one that only
asks where data lives (``locations``) loads nothing but that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loader._lazy import lazy_names
from loader.sources.locations import in_object_storage, split_url

if TYPE_CHECKING:
    from loader.sources.base import Source

__all__ = [
    "IMG_EXTENSIONS",
    "ArrowSource",
    "HFDatasetSource",
    "S3ImageFolderSource",
    "FileTreeSource",
    "ImageFolderSource",
    "LMDBSource",
    "Source",
    "arrow_data",
    "image_folder",
    "in_object_storage",
    "split_url",
    "TarShardsSource",
    "image_folder_to_arrow",
    "image_folder_to_lmdb",
    "image_folder_to_tar_shards",
]

LAZY = {
    "Source": "loader.sources.base",
    "IMG_EXTENSIONS": "loader.sources.image_folder_source",
    "ImageFolderSource": "loader.sources.image_folder_source",
    "FileTreeSource": "loader.sources.file_tree",
    "TarShardsSource": "loader.sources.tar_shards",
    "ArrowSource": "loader.sources.arrow_source",
    "HFDatasetSource": "loader.sources.hf_dataset",
    "arrow_data": "loader.sources.hf_dataset",
    "S3ImageFolderSource": "loader.sources.object_store",
    "LMDBSource": "loader.sources.lmdb_source",
    "image_folder_to_arrow": "loader.sources.convert",
    "image_folder_to_lmdb": "loader.sources.convert",
    "image_folder_to_tar_shards": "loader.sources.convert",
}


def image_folder(root: Any) -> Source:
    """The image folder at ``root``: a local folder, or ``s3://bucket/prefix`` in object storage."""
    if isinstance(root, str) and in_object_storage(root):
        from loader.sources.object_store import S3ImageFolderSource

        return S3ImageFolderSource(root)
    from loader.sources.image_folder_source import ImageFolderSource

    return ImageFolderSource(root)


__getattr__, __dir__ = lazy_names(__name__, LAZY, globals(), __all__)
