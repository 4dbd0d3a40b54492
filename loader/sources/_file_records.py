"""Sources whose record ``i`` is the whole file ``describe(i)``: an image folder, any file tree."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import xxhash

from loader.errors import BadRecordError
from loader.sources._listing import Listing
from loader.sources.base import Source
from loader.system.pagecache import evict_file, read_admitting

__all__ = ["FileRecords", "file_identity"]

_IDENTITY = struct.Struct("<2q")


def file_identity(st: os.stat_result) -> int:
    """A file's size and mtime folded to 64 bits, never 0 (what a source whose records cannot change says):
    a file rewritten changes them. Not its inode, device or ctime: a ``chmod``, a restore or ``rsync -a`` of
    the same bytes, a remount, change those alone, and would leave every record of the store unserved."""
    return xxhash.xxh3_64_intdigest(_IDENTITY.pack(st.st_size, st.st_mtime_ns)) or 1


class FileRecords(Source):
    """``read`` and ``read_admitting`` for a source of one file per record, listed in ``_listing`` (its paths
    and fingerprint); subclasses give ``describe``."""

    _listing: Listing
    changes = True  # a file rewritten in place keeps the listing's fingerprint

    @property
    def fingerprint(self) -> str:
        """Digest of every file's relative path (and label) as listed: files added, removed or renamed
        change it; a file's content is checked by ``identity`` as a cache serves it."""
        return self._listing.fingerprint

    def identity(self, index: int) -> int:
        """The file's ``file_identity`` now (one ``os.stat``), or 0 where it cannot be stat'ed (then no
        cache serves it, and its read names the file)."""
        try:
            return file_identity(os.stat(self.describe(self.check_index(index))))
        except OSError:
            return 0

    def read(self, index: int) -> bytes:
        i = self.check_index(index)
        path = self.describe(i)
        try:
            with open(path, "rb", buffering=0) as f:
                return f.readall()
        except OSError as e:
            raise BadRecordError(path, i, f"cannot read the file: {e.strerror or e}") from e

    def read_admitting(
        self, index: int, admit: Callable[[bytes, bool], bool], takes: Callable[[int], bool] | None = None
    ) -> tuple[bytes, bool]:
        """A file whose pages this read brought in is ours to evict at its first hit; a cold file the cache
        ``takes`` is read around the page cache (``loader.system.pagecache``)."""
        i = self.check_index(index)
        path = self.describe(i)
        try:
            return read_admitting(path, admit, takes)
        except OSError as e:
            raise BadRecordError(path, i, f"cannot read the file: {e.strerror or e}") from e

    def evict(self, index: int) -> None:
        evict_file(self.describe(self.check_index(index)))
