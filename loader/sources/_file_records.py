"""Sources whose record ``i`` is the whole file ``describe(i)``: an image folder, any file tree."""

from __future__ import annotations

from collections.abc import Callable

from loader.errors import BadRecordError
from loader.sources.base import Source
from loader.system.pagecache import evict_file, read_admitting

__all__ = ["FileRecords"]


class FileRecords(Source):
    """``read`` and ``read_admitting`` for a source of one file per record; subclasses give ``describe``."""

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
