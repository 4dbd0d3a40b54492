"""ImageNet-layout folders: ``root/<class>/<image>``, one record per image file."""

from __future__ import annotations

import functools
import os

from loader.errors import SourceError
from loader.sources._file_records import FileRecords
from loader.sources._kept_listing import kept_listing
from loader.sources._listing import Batch, Folders, Listing, scanned

__all__ = ["IMG_EXTENSIONS", "ImageFolderSource"]

KIND = "image-folder"
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolderSource(FileRecords):
    """Images under ``root/<class>/`` (subfolders included), as torchvision's ImageFolder lists them.

    Classes are the sorted names of the non-hidden folders in ``root`` (label ids 0..K-1); records are sorted
    by class, then by path. Extensions match case-insensitively. ``read`` returns the file's bytes. The
    listing kept by an earlier run is used while the folders are unchanged (``_kept_listing``); the
    fingerprint covers the paths and labels, and a file rewritten in place is told by its ``identity``, which
    a cache keeps with the record.
    """

    thread_safe_reads = True  # each read opens, reads and closes its own file

    def __init__(self, root: str | os.PathLike, *, extensions: tuple[str, ...] = IMG_EXTENSIONS) -> None:
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise SourceError(f"image folder {self.root!r} does not exist or is not a directory")
        self.extensions = tuple(e.lower() for e in extensions)
        top = os.path.abspath(self.root)
        scan = functools.partial(self._scan, top)
        self._listing = kept_listing((KIND, top, *self.extensions), top, scan)
        self.classes: list[str] = self._listing.meta["classes"]
        if not self.classes:
            raise SourceError(
                f"image folder {self.root!r} has no class folders (expected root/<class>/<image>)"
            )
        if not len(self._listing):
            raise SourceError(f"image folder {self.root!r} has no image files ending in {self.extensions}")
        self._paths, self._labels = self._listing.paths, self._listing.labels
        self.nbytes = self._listing.nbytes

    def _scan(self, top: str) -> Listing:
        folders = Folders(top)
        classes = sorted(e.name for e in folders.entries("") if e.is_dir())
        batches = (self._images(folders, name, label) for label, name in enumerate(classes))
        return scanned(KIND, top, batches, folders, {"classes": classes}, labelled=True)

    def _images(self, folders: Folders, class_dir: str, label: int) -> Batch:
        """The images under ``class_dir`` (subfolders too), sorted by relative path; no file is stat'ed."""
        found: list[str] = []
        self._find(folders, class_dir, found)
        found.sort()
        return found, label

    def _find(self, folders: Folders, rel_dir: str, found: list[str]) -> None:
        prefix = rel_dir + os.sep
        entries = folders.entries(rel_dir)
        found.extend(
            [prefix + e.name for e in entries if e.name.lower().endswith(self.extensions) and e.is_file()]
        )
        for entry in entries:
            if entry.is_dir():
                self._find(folders, prefix + entry.name, found)

    def __len__(self) -> int:
        return len(self._paths)

    def label(self, index: int) -> int:
        return self._labels[self.check_index(index)]

    def describe(self, index: int) -> str:
        return os.path.join(self.root, self._paths[self.check_index(index)])
