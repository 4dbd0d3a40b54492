"""A Hugging Face ``datasets.Dataset`` as it lies on disk: one record per row, read zero-copy from its Arrow
files.

``Dataset.save_to_disk(path)`` writes ``path/state.json``, which lists the dataset's Arrow files (IPC streams,
one per shard) in order, and a ``load_dataset`` cache keeps the same kind of file. Each file is read by
``ArrowSource`` (memory-mapped, a value copied only when read; an ``Image`` column gives its encoded bytes, a
sequence of integers gives tokens), and the files are laid end to end. The ``datasets`` library is not
imported: the Arrow files are the dataset.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from loader.errors import SourceError
from loader.sources._fingerprint import digest
from loader.sources.arrow_source import ArrowSource
from loader.sources.base import Source

__all__ = ["HFDatasetSource", "arrow_data", "is_saved_dataset"]

STATE = "state.json"


def is_saved_dataset(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder ``Dataset.save_to_disk`` wrote."""
    return os.path.isfile(os.path.join(path, STATE))


class HFDatasetSource(Source):
    """The rows of the dataset at ``path``: a folder ``save_to_disk`` wrote, or one of its ``.arrow`` files.
    ``column`` is the record column (None: the only binary, ``Image`` or integer-sequence one); the label is
    ``label_column``'s value, by default ``label`` where the dataset has one (a ``ClassLabel``'s id)."""

    def __init__(
        self, path: str | os.PathLike, column: str | None = None, label_column: str | None = "label"
    ) -> None:
        self.path = os.fspath(path)
        files = self._files()
        first = ArrowSource(files[0], column=column)
        if label_column is not None and label_column not in first.columns:
            if label_column != "label":
                raise SourceError(f"{self.path!r} has no column {label_column!r}; columns: {first.columns}")
            label_column = None  # the default: no label column, no labels
        self.parts = [ArrowSource(f, column=first.column, label_column=label_column) for f in files]
        self.column, self.label_column, self.kind = first.column, label_column, first.kind
        self.columns = first.columns
        self._starts = list(itertools.accumulate(map(len, self.parts), initial=0))
        self.nbytes = sum(part.nbytes for part in self.parts)
        self._fingerprint = digest(part.fingerprint for part in self.parts)

    def _files(self) -> list[str]:
        if not os.path.isdir(self.path):
            if not os.path.isfile(self.path):
                raise SourceError(f"Hugging Face dataset {self.path!r} does not exist")
            return [self.path]
        try:
            with open(os.path.join(self.path, STATE)) as f:
                names = [entry["filename"] for entry in json.load(f)["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SourceError(f"{self.path!r} is not a dataset save_to_disk wrote ({STATE}: {e})") from e
        if not names:
            raise SourceError(f"{self.path!r}: {STATE} lists no Arrow files")
        return [os.path.join(self.path, name) for name in names]

    def __len__(self) -> int:
        return self._starts[-1]

    def _part(self, index: int) -> tuple[ArrowSource, int]:
        i = self.check_index(index)
        k = bisect.bisect_right(self._starts, i) - 1
        return self.parts[k], i - self._starts[k]

    def read(self, index: int) -> bytes:
        part, row = self._part(index)
        return part.read(row)

    def read_admitting(
        self, index: int, admit: Callable[[bytes, bool], bool], takes: Callable[[int], bool] | None = None
    ) -> tuple[bytes, bool]:
        part, row = self._part(index)
        return part.read_admitting(row, admit, takes)

    def evict(self, index: int) -> None:
        part, row = self._part(index)
        part.evict(row)

    def label(self, index: int) -> Any:
        part, row = self._part(index)
        return part.label(row)

    def describe(self, index: int) -> str:
        part, row = self._part(index)
        return part.describe(row)

    def token_lengths(self) -> np.ndarray:
        """Every row's token count, the files in order (``loader.packing`` packs by them)."""
        return np.concatenate([part.token_lengths() for part in self.parts])

    @property
    def fingerprint(self) -> str:
        """Digest of its files' fingerprints (size, mtime, rows, record column, schema), in order."""
        return self._fingerprint


def arrow_data(
    path: str | os.PathLike, column: str | None = None, label_column: str | None = None
) -> ArrowSource | HFDatasetSource:
    """The Arrow data at ``path``: a folder ``save_to_disk`` wrote (its labels in ``label`` unless another
    ``label_column`` is named), else one Arrow IPC file or stream, or Parquet file."""
    if is_saved_dataset(path):
        return HFDatasetSource(path, column, label_column if label_column is not None else "label")
    return ArrowSource(path, column=column, label_column=label_column)
