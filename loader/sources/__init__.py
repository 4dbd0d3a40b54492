"""Data sources: index -> raw record bytes, from an image folder, an LMDB, or an Arrow IPC / Parquet file."""

from loader.sources.arrow_source import ArrowSource
from loader.sources.base import Source
from loader.sources.convert import image_folder_to_arrow, image_folder_to_lmdb
from loader.sources.file_tree import FileTreeSource
from loader.sources.image_folder import IMG_EXTENSIONS, ImageFolderSource
from loader.sources.lmdb_source import LMDBSource

__all__ = [
    "IMG_EXTENSIONS",
    "ArrowSource",
    "FileTreeSource",
    "ImageFolderSource",
    "LMDBSource",
    "Source",
    "image_folder_to_arrow",
    "image_folder_to_lmdb",
]
