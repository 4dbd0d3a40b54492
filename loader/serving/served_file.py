"""A file served from the cache by ``DataLoader(cache_files=...)``: its bytes as the file object ``open``
would give, binary or text."""

from __future__ import annotations

import io
from typing import Any

__all__ = ["ServedFile", "served_file", "served_text"]


class ServedFile(io.BytesIO):
    """A served file: its bytes, read-only, with the ``name`` and ``mode`` that ``open`` gives a real file
    (made by ``served_file``: a Python ``__init__`` cost a third of the served open's own time).

    ``fileno()`` opens the real file, for callers that map it (``np.load(path, mmap_mode="r")``); those reads
    come from storage.
    """

    name: Any
    mode = "rb"
    _real: io.FileIO | None = None

    def writable(self) -> bool:
        return False

    def write(self, data: Any) -> int:
        raise io.UnsupportedOperation("write")

    def writelines(self, lines: Any) -> None:
        raise io.UnsupportedOperation("write")

    def truncate(self, size: int | None = None) -> int:
        raise io.UnsupportedOperation("truncate")

    def peek(self, size: int = 0) -> bytes:
        """Bytes ahead without moving, as ``BufferedReader.peek`` gives (some parsers sniff with it)."""
        here = self.tell()
        ahead = self.read(max(size, io.DEFAULT_BUFFER_SIZE))
        self.seek(here)
        return ahead

    def fileno(self) -> int:
        if self._real is None:
            self._real = io.FileIO(self.name, "r")
        return self._real.fileno()

    def close(self) -> None:
        if self._real is not None:
            self._real.close()
        super().close()


def served_file(raw: bytes, name: Any) -> ServedFile:
    """``raw`` served as the file ``name``, opened ``"rb"``."""
    served = ServedFile(raw)
    served.name = name
    return served


def served_text(
    served: ServedFile, mode: str, encoding: str | None, errors: str | None, newline: str | None
) -> Any:
    """``served`` read as text, with the encoding the real open would choose."""
    text = io.TextIOWrapper(served, io.text_encoding(encoding), errors, newline)  # type: ignore[arg-type]
    text.mode = mode  # type: ignore[misc]
    return text
