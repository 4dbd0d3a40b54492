"""Readers behind ArrowSource: a file as numbered chunks (record batches or row groups); a record's value
in a chunk is read through ``_arrow_values``."""

from __future__ import annotations

import functools
import mmap
import os
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loader.errors import SourceError
from loader.sources._arrow_values import record_column
from loader.sources._mapped import MappedFile
from loader.sources._object_files import open_object
from loader.sources.locations import in_object_storage
from loader.system.pagecache import prefetch

__all__ = ["IpcFile", "ParquetFile", "open_file"]

_STREAM = b"\xff\xff\xff\xff"  # an IPC stream's first message starts with the continuation marker


class IpcFile:
    """An Arrow IPC file, or an IPC stream (as Hugging Face ``datasets`` writes its ``.arrow`` files), mapped
    with MADV_RANDOM; record batches are the chunks (a stream's are listed once: their bodies stay unread).

    Mapped by us rather than by ``pa.memory_map``, which advises WILLNEED on every batch body it reads and so
    pulls whole batches into the page cache; here a read touches only its value (prefetched as one request).
    """

    def __init__(self, path: str, stream: bool = False) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._map.madvise(mmap.MADV_RANDOM)
        buffer = pa.BufferReader(pa.py_buffer(self._map))
        reader = pa.ipc.open_stream(buffer) if stream else pa.ipc.open_file(buffer)
        self.schema = reader.schema
        if stream:
            self._batches = list(reader)
        else:
            self._batches = [reader.get_batch(k) for k in range(reader.num_record_batches)]
        self._path = path
        self._mapped: MappedFile | None = None

    def chunk_rows(self) -> list[int]:
        return [batch.num_rows for batch in self._batches]

    def chunk(self, k: int, name: str) -> pa.Array:
        return record_column(self._batches[k].column(name))

    def column_bytes(self, name: str) -> int:
        """Nothing beyond the file: its values lie in it uncompressed."""
        return 0

    def copy(self, view: np.ndarray, convert: Callable[[np.ndarray], bytes]) -> bytes:
        """``convert(view)`` with the view's pages read in one request first."""
        prefetch(view.ctypes.data, view.nbytes)
        return convert(view)

    def copy_admitting(
        self, view: np.ndarray, convert: Callable[[np.ndarray], bytes], admit: Callable[[bytes, bool], bool]
    ) -> tuple[bytes, bool]:
        """As ``copy``, then offered to ``admit(data, ours)``, ``ours`` where this read brought in every page
        wholly inside the value (``MappedFile.cold_inside``); those pages are then unmapped from this process
        once admitted, and left in the page cache until the store's first hit of the record (``evict``)."""
        mapped = self._mapped_file()
        address = view.ctypes.data
        ours = mapped.cold_inside(address, view.nbytes)
        data = self.copy(view, convert)
        admitted = admit(data, ours)
        if admitted and ours:
            mapped.unmap(address, view.nbytes)
        return data, admitted

    def evict(self, view: np.ndarray) -> None:
        """Evict the value's pages from the page cache (its record was admitted by a read that brought
        them in, and the store has since served it)."""
        self._mapped_file().evict(view.ctypes.data, view.nbytes)

    def _mapped_file(self) -> MappedFile:
        if self._mapped is None:
            self._mapped = MappedFile(self._path)
        return self._mapped


class ParquetFile:
    """A Parquet file (a path, or an object storage file); row groups are the chunks. A row group is read
    and decompressed whole, so its pages hold other records too (compressed): they are left to the kernel,
    never evicted by a read."""

    def __init__(self, source: str | pa.NativeFile) -> None:
        self._file = pq.ParquetFile(source, memory_map=False)
        self.schema = self._file.schema_arrow

    def chunk_rows(self) -> list[int]:
        meta = self._file.metadata
        return [meta.row_group(k).num_rows for k in range(meta.num_row_groups)]

    def chunk(self, k: int, name: str) -> pa.Array:
        return record_column(self._file.read_row_group(k, columns=[name]).column(0).combine_chunks())

    def copy(self, view: np.ndarray, convert: Callable[[np.ndarray], bytes]) -> bytes:
        return convert(view)  # the row group was read whole

    def column_bytes(self, name: str) -> int:
        """The column's size before compression, over all row groups."""
        meta, j = self._file.metadata, self.schema.get_field_index(name)
        return sum(meta.row_group(k).column(j).total_uncompressed_size for k in range(meta.num_row_groups))

    def copy_admitting(
        self, view: np.ndarray, convert: Callable[[np.ndarray], bytes], admit: Callable[[bytes, bool], bool]
    ) -> tuple[bytes, bool]:
        data = convert(view)
        return data, admit(data, False)

    def evict(self, view: np.ndarray) -> None:
        """Nothing: no read of a row group is ever the store's to evict (``copy_admitting``)."""


def open_file(path: str) -> IpcFile | ParquetFile:
    """The right reader for the file's magic bytes, or SourceError naming the file."""
    if in_object_storage(path):
        return _parquet_object(path)
    try:
        with open(path, "rb", buffering=0) as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # 6 bytes, not a read-ahead of records
            magic = f.read(6)
    except OSError as e:
        raise SourceError(f"Arrow/Parquet file {path!r} cannot be opened: {e.strerror or e}") from e
    kinds = {
        b"ARROW1": ("Arrow IPC", IpcFile),
        b"PAR1": ("Parquet", ParquetFile),
        _STREAM: ("Arrow IPC stream", functools.partial(IpcFile, stream=True)),
    }
    name, kind = kinds.get(magic, kinds.get(magic[:4], ("", None)))
    if kind is None:
        raise SourceError(f"{path!r} is neither an Arrow IPC file or stream nor a Parquet file")
    try:
        return kind(path)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise SourceError(f"{path!r} is not a readable {name} file: {e}") from e


def _parquet_object(url: str) -> ParquetFile:
    """A Parquet file in object storage; an Arrow IPC one is refused (its reads are by memory map)."""
    file = open_object(url)
    if file.read(4) != b"PAR1":
        raise SourceError(
            f"{url!r} is not a Parquet file: from object storage only Parquet is read (by ranged requests); "
            "copy an Arrow IPC file to local storage, or write it as Parquet"
        )
    try:
        return ParquetFile(file)
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"{url!r} is not a readable Parquet file: {e}") from e
