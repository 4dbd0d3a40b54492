"""Arrow IPC files (.arrow, .feather) and streams (Hugging Face ``datasets`` files), and Parquet files: one
row per record.

The record column is either binary (an encoded image: ``read`` returns the bytes; a Hugging Face ``Image``
column gives its ``bytes``) or a list of integers (a token sequence: ``read`` returns ``np.asarray(values,
dtype="<i4").tobytes()``, little-endian int32).
An IPC file is memory-mapped and read without copies except the value itself. A Parquet file has no random
access below the row group: a read decodes the whole row group holding the row (the last one stays decoded in
each process), so use small row groups, or IPC, for random order. A Parquet file may also be in object
storage (``s3://bucket/key.parquet``, ``_object_files``): its row groups are fetched by ranged requests.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loader.errors import BadRecordError, SourceError
from loader.sources._arrow_files import IpcFile, ParquetFile, open_file
from loader.sources._arrow_values import binary_value, record_type, token_value
from loader.sources._fingerprint import digest
from loader.sources._object_files import file_stat
from loader.sources.base import Source

__all__ = ["ArrowSource"]


def _is_binary(t: pa.DataType) -> bool:
    """Binary, or a Hugging Face ``Image`` (a struct whose ``bytes`` are binary)."""
    t = record_type(t)
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _is_record_type(t: pa.DataType) -> bool:
    return _is_binary(t) or (
        (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)
    )


def _pick_column(schema: pa.Schema, column: str | None, path: str) -> str:
    """The record column: the one named, or the only binary / list-of-int column."""
    listing = ", ".join(f"{f.name} ({f.type})" for f in schema)
    if column is None:
        found = [f.name for f in schema if _is_record_type(f.type)]
        if len(found) != 1:
            raise SourceError(
                f"{path!r}: name the record column; binary or list<int> columns: {found}; "
                f"all columns: {listing}"
            )
        return found[0]
    if column not in schema.names:
        raise SourceError(f"{path!r} has no column {column!r}; columns: {listing}")
    if not _is_record_type(schema.field(column).type):
        raise SourceError(
            f"{path!r}: column {column!r} is {schema.field(column).type}, not binary or a list of integers"
        )
    return column


class ArrowSource(Source):
    """Rows of an Arrow IPC or Parquet file; ``label_column`` (optional) gives ``label``.

    ``kind`` is ``"binary"`` (records are the bytes of a binary column) or ``"tokens"`` (a list-of-integers
    column; records are the sequence as little-endian int32 bytes).
    """

    _per_process = ("_handle", "_chunk", "_labels")

    def __init__(
        self, path: str | os.PathLike, column: str | None = None, label_column: str | None = None
    ) -> None:
        self.path = os.fspath(path)
        self._pid: int | None = None
        schema = self._io().schema
        self.column = _pick_column(schema, column, self.path)
        if label_column is not None and label_column not in schema.names:
            raise SourceError(f"{self.path!r} has no label column {label_column!r}; columns: {schema.names}")
        self.label_column = label_column
        self.columns: list[str] = schema.names
        self.kind = "binary" if _is_binary(schema.field(self.column).type) else "tokens"
        self._value = binary_value if self.kind == "binary" else token_value
        self._starts = list(itertools.accumulate(self._io().chunk_rows(), initial=0))
        self._len = self._starts.pop()
        size, mtime_ns = file_stat(self.path)
        self.nbytes = max(size, self._io().column_bytes(self.column))
        self._fingerprint = digest([size, mtime_ns, self._len, self.column, schema.to_string()])

    def _io(self) -> IpcFile | ParquetFile:
        """This process's reader; a forked or unpickled copy opens its own."""
        if self._pid != os.getpid():
            self._handle = open_file(self.path)
            self._chunk: tuple[int, pa.Array | None] = (-1, None)
            self._labels: list[Any] | None = None
            self._pid = os.getpid()
        return self._handle

    def __len__(self) -> int:
        return self._len

    def read(self, index: int) -> bytes:
        view = self._view(index)  # first: it opens this process's reader, and names the record if it cannot
        return self._io().copy(view, self._convert)

    def read_admitting(
        self, index: int, admit: Callable[[bytes, bool], bool], takes: Callable[[int], bool] | None = None
    ) -> tuple[bytes, bool]:
        """An IPC value whose pages this read brought in is ours to evict at its first hit
        (``loader.system.pagecache``); a Parquet row group's never. A value is read from its mapping
        whatever the cache ``takes``."""
        view = self._view(index)
        return self._io().copy_admitting(view, self._convert, admit)

    def evict(self, index: int) -> None:
        self._io().evict(self._view(index))

    def _view(self, index: int) -> np.ndarray:
        """Record ``index``'s value, viewed where it lies (its pages not yet touched)."""
        i = self.check_index(index)
        k = bisect.bisect_right(self._starts, i) - 1
        try:
            arr, row = self._chunk_array(k), i - self._starts[k]
        except (OSError, SourceError) as e:  # the file is gone or damaged, the object storage does not answer
            raise BadRecordError(self.describe(i), i, f"cannot read its row group or batch: {e}") from e
        if arr.null_count and not arr[row].is_valid:
            raise BadRecordError(self.describe(i), i, f"null in column {self.column!r}")
        try:
            return self._value(arr, row)
        except ValueError as e:
            raise BadRecordError(self.describe(i), i, str(e)) from e

    def _convert(self, view: np.ndarray) -> bytes:
        return view.tobytes() if self._value is binary_value else np.asarray(view, dtype="<i4").tobytes()

    def _chunk_array(self, k: int) -> pa.Array:
        """The record column of chunk ``k``; the last chunk read stays decoded."""
        io = self._io()
        if self._chunk[0] != k:
            self._chunk = (k, io.chunk(k, self.column))
        return self._chunk[1]

    def token_lengths(self) -> np.ndarray:
        """Every record's token count (int64; a null counts 0), from the lists' offsets: what
        ``loader.packing`` packs by. IPC files are not read past the offsets; Parquet decodes the column."""
        if self.kind != "tokens":
            raise SourceError(f"{self.path!r}: column {self.column!r} is binary, not token lists")
        chunks = (self._io().chunk(k, self.column) for k in range(len(self._starts)))
        counts = [pc.list_value_length(chunk).fill_null(0).to_numpy() for chunk in chunks]
        return np.concatenate([np.zeros(0, np.int64), *counts]).astype(np.int64)

    def label(self, index: int) -> Any:
        """The label column's value (loaded whole once per process), or None without a label column."""
        i = self.check_index(index)
        if self.label_column is None:
            return None
        io = self._io()
        if self._labels is None:
            chunks = (io.chunk(k, self.label_column) for k in range(len(self._starts)))
            self._labels = [value for chunk in chunks for value in chunk.to_pylist()]
        return self._labels[i]

    def describe(self, index: int) -> str:
        return f"{self.path}:{index}"

    @property
    def fingerprint(self) -> str:
        """Digest of the file's size, mtime, row count, record column and schema."""
        return self._fingerprint
