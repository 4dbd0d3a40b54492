"""Ready-made datasets over a Source: raw bytes from the cache or storage, then decode + augment.

The cache holds raw records, never decoded samples, so random augmentation stays random every epoch.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from loader.cache import MinIOCache
from loader.decode import make_transform
from loader.errors import BadRecordError
from loader.sources import ArrowSource, ImageFolderSource, LMDBSource, Source
from loader.stats import StatsBoard

__all__ = ["SKIPPED", "ArrowDataset", "ImageFolder", "LMDBDataset", "SourceDataset", "tokens_to_tensor"]

Transform = Literal["train", "eval"] | Callable[[bytes], Any] | None
OnError = Literal["raise", "skip"]


class _Skipped:
    """Stands in for a bad record under ``on_error="skip"``; the loader's collate drops it."""

    def __reduce__(self) -> str:
        return "SKIPPED"

    def __repr__(self) -> str:
        return "SKIPPED"


SKIPPED = _Skipped()


class SourceDataset(Dataset):
    """``dataset[i] -> (transform(raw_bytes_i), label_i)``; ``transform=None`` gives the raw bytes."""

    def __init__(self, source: Source, transform: Transform = None) -> None:
        self.source = source
        self.transform = make_transform(transform)
        self._cache: MinIOCache | None = None
        self._board: StatsBoard | None = None
        self._on_error: OnError = "raise"

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        index = self.source.check_index(index)
        try:
            raw = self._fetch(index)
            sample = self._decode(index, raw)
        except BadRecordError:
            if self._on_error == "raise":
                raise
            self._count("records_skipped", 1)
            return SKIPPED
        return sample, self.source.label(index)

    def bind(self, *, cache: MinIOCache | None, board: StatsBoard, on_error: OnError) -> SourceDataset:
        """A copy that reads through ``cache``, reports into ``board``, treats bad records per on_error."""
        bound = copy.copy(self)
        bound.source = copy.copy(self.source)
        bound.source.drop_page_cache = cache is not None
        bound._cache, bound._board, bound._on_error = cache, board, on_error
        return bound

    def _fetch(self, index: int) -> bytes:
        start = time.perf_counter()
        raw = self._cache.get(index) if self._cache is not None else None
        if raw is not None:
            self._count("hits", 1)
            self._count("bytes_from_cache", len(raw))
        else:
            raw = self.source.read(index)
            self._count("misses", 1)
            self._count("bytes_from_source", len(raw))
            if self._cache is not None and self._cache.admit(index, raw):
                self._count("records_admitted", 1)
        self._count("fetch_seconds", time.perf_counter() - start)
        return raw

    def _decode(self, index: int, raw: bytes) -> Any:
        if self.transform is None:
            return raw
        start = time.perf_counter()
        try:
            sample = self.transform(raw)
        except (ValueError, OSError) as exc:
            raise BadRecordError(self.source.describe(index), index, str(exc)) from exc
        self._count("decode_seconds", time.perf_counter() - start)
        return sample

    def _count(self, field: str, amount: float) -> None:
        if self._board is not None:
            self._board.add(field, amount)


class ImageFolder(SourceDataset):
    """Images in the ImageNet layout ``root/<class>/<file>``; labels from the sorted class folder names."""

    def __init__(self, root: str, transform: Transform = "train") -> None:
        super().__init__(ImageFolderSource(root), transform)
        self.classes = self.source.classes


class LMDBDataset(SourceDataset):
    """Records of an LMDB environment in the layout of ``docs/sources.md`` (see ``image_folder_to_lmdb``)."""

    def __init__(self, path: str, transform: Transform = "train") -> None:
        super().__init__(LMDBSource(path), transform)


def tokens_to_tensor(raw: bytes) -> torch.Tensor:
    """The int64 tensor of a token sequence stored as little-endian int32 (how ArrowSource returns lists)."""
    return torch.from_numpy(np.frombuffer(raw, dtype="<i4").astype(np.int64))


class ArrowDataset(SourceDataset):
    """One column of an Arrow IPC or Parquet file: images (binary) or token sequences (list of integers).

    With ``transform=None`` a token column gives int64 tensors and a binary column gives raw bytes.
    """

    def __init__(
        self,
        path: str,
        column: str | None = None,
        label_column: str | None = None,
        transform: Transform = None,
    ) -> None:
        source = ArrowSource(path, column=column, label_column=label_column)
        if transform is None and source.kind == "tokens":
            transform = tokens_to_tensor
        super().__init__(source, transform)
