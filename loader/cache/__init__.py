"""The node-local minimal-miss cache of raw records."""

from loader.cache._private import UntrustedCacheError
from loader.cache.minio import LOCK_TIMEOUT, CacheInfo, CorruptRecordError, MinIOCache, store_path

__all__ = [
    "LOCK_TIMEOUT",
    "CacheInfo",
    "CorruptRecordError",
    "MinIOCache",
    "UntrustedCacheError",
    "store_path",
]
