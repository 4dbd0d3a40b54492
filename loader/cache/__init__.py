"""The node-local minimal-miss cache of raw records."""

from loader.cache._layout import index_bytes
from loader.cache.minio import LOCK_TIMEOUT, Admission, CacheInfo, CorruptRecordError, MinIOCache, store_path
from loader.system.private import UntrustedCacheError

__all__ = [
    "LOCK_TIMEOUT",
    "Admission",
    "CacheInfo",
    "CorruptRecordError",
    "MinIOCache",
    "UntrustedCacheError",
    "index_bytes",
    "store_path",
]
