"""ImageNet-layout folders: ``root/<class>/<image>``, one record per image file."""

from __future__ import annotations

import os

from loader.errors import SourceError
from loader.sources._file_records import FileRecords
from loader.sources._fingerprint import digest

__all__ = ["IMG_EXTENSIONS", "ImageFolderSource"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolderSource(FileRecords):
    """Images under ``root/<class>/`` (subfolders included), as torchvision's ImageFolder lists them.

    Classes are the sorted names of the non-hidden folders in ``root`` (label ids 0..K-1); records are sorted
    by class, then by path. Extensions match case-insensitively. ``read`` returns the file's bytes.
    """

    thread_safe_reads = True  # each read opens, reads and closes its own file

    def __init__(self, root: str | os.PathLike, *, extensions: tuple[str, ...] = IMG_EXTENSIONS) -> None:
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise SourceError(f"image folder {self.root!r} does not exist or is not a directory")
        self.extensions = tuple(e.lower() for e in extensions)
        with os.scandir(self.root) as entries:
            self.classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
        if not self.classes:
            raise SourceError(
                f"image folder {self.root!r} has no class folders (expected root/<class>/<image>)"
            )
        files = []
        for label, name in enumerate(self.classes):
            files.extend((rel, label, size, mtime) for rel, size, mtime in sorted(self._scan(name)))
        if not files:
            raise SourceError(f"image folder {self.root!r} has no image files ending in {self.extensions}")
        self._paths = [f[0] for f in files]
        self._labels = [f[1] for f in files]
        self.nbytes = sum(f[2] for f in files)
        self._fingerprint = digest((rel, size, mtime) for rel, _, size, mtime in files)

    def _scan(self, rel_dir: str) -> list[tuple[str, int, int]]:
        """(relative path, size, mtime_ns) of the images under ``rel_dir``; one stat per file."""
        found = []
        with os.scandir(os.path.join(self.root, rel_dir)) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                rel = os.path.join(rel_dir, entry.name)
                if entry.is_dir():
                    found.extend(self._scan(rel))
                elif entry.name.lower().endswith(self.extensions) and entry.is_file():
                    st = entry.stat()
                    found.append((rel, st.st_size, st.st_mtime_ns))
        return found

    def __len__(self) -> int:
        return len(self._paths)

    def label(self, index: int) -> int:
        return self._labels[self.check_index(index)]

    def describe(self, index: int) -> str:
        return os.path.join(self.root, self._paths[self.check_index(index)])

    @property
    def fingerprint(self) -> str:
        """Digest of every image's relative path, size and mtime as listed when the source was opened."""
        return self._fingerprint
