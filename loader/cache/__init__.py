"""The node-local minimal-miss cache of raw records."""

from loader.cache.minio import CacheInfo, MinIOCache, store_path

__all__ = ["CacheInfo", "MinIOCache", "store_path"]
