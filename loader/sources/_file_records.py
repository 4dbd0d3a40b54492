"""Sources whose record ``i`` is the whole file ``describe(i)``: an image folder, any file tree."""

from __future__ import annotations

import os
from collections.abc import Callable

from loader.errors import BadRecordError
from loader.sources._listing import Listing
from loader.sources.base import Source
from loader.system.pagecache import evict_file, read_admitting

__all__ = ["FileRecords"]


class FileRecords(Source):
    """``read`` and ``read_admitting`` for a source of one file per record, listed in ``_listing`` (its
    fingerprint, each file's size and mtime as listed); subclasses give ``describe``."""

    _listing: Listing
    _per_process = ("_checked",)  # the records whose file this process found unchanged (``unchanged``)

    @property
    def fingerprint(self) -> str:
        """Digest of every file's relative path, size and mtime (and label) as listed: where the listing was
        kept from an earlier run, as they were then (a file rewritten in place since is caught by
        ``unchanged``, not here)."""
        return self._listing.fingerprint

    def listed(self, index: int) -> tuple[int, int]:
        """(size, mtime_ns) of file ``index`` when the tree was listed."""
        i = self.check_index(index)
        return self._listing.sizes[i], self._listing.mtimes[i]

    def unchanged(self, index: int) -> bool:
        """Whether file ``index`` still has the size and mtime it was listed with (one ``os.stat``, once per
        record in each process): a file rewritten since it was listed, even in place where no folder
        changes, is read from storage, never served from a cache."""
        i = self.check_index(index)
        checked = self.__dict__.get("_checked")
        if checked is None:
            checked = self._checked = bytearray(len(self))
        if checked[i]:
            return True
        try:
            st = os.stat(self.describe(i))
        except OSError:
            return False
        checked[i] = same = self.matches(i, st)
        return same

    def matches(self, index: int, st: os.stat_result) -> bool:
        """Whether ``st`` (a stat of file ``index``) has the size and mtime the file was listed with."""
        return (st.st_size, st.st_mtime_ns) == self.listed(index)

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
