"""Values of an Arrow column, viewed where they lie: a record's bytes (binary, or a Hugging Face ``Image``'s
``bytes``) or its tokens (a list of integers)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["binary_value", "record_column", "record_type", "token_value"]

_INT32 = np.iinfo(np.int32)


def _is_image(t: pa.DataType) -> bool:
    """A Hugging Face ``Image`` column's type: a struct of ``bytes`` and ``path``."""
    return pa.types.is_struct(t) and t.get_field_index("bytes") >= 0


def record_type(t: pa.DataType) -> pa.DataType:
    """The type of the values a record is read from in a column of type ``t`` (``record_column``)."""
    return t.field("bytes").type if _is_image(t) else t


def record_column(arr: pa.Array) -> pa.Array:
    """The values a record is read from: a Hugging Face ``Image`` column gives its ``bytes``; any other
    column is itself."""
    return arr.field("bytes") if _is_image(arr.type) else arr


def binary_value(arr: pa.Array, row: int) -> np.ndarray:
    """A zero-copy uint8 view of a binary value."""
    _, offsets, data = arr.buffers()
    kind = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    start, end = np.frombuffer(offsets, dtype=kind)[arr.offset + row : arr.offset + row + 2]
    if data is None or end == start:
        return np.empty(0, np.uint8)
    return np.frombuffer(data, np.uint8, count=int(end - start), offset=int(start))


def token_value(arr: pa.Array, row: int) -> np.ndarray:
    """A zero-copy integer view of a list-of-int value; ValueError for a null or a token beyond int32."""
    values = arr[row].values
    if values.null_count:
        raise ValueError("the token list holds a null")
    view = np.asarray(values)
    wide = view.dtype.itemsize >= 4 and view.dtype != np.int32
    if view.size and wide and (view.min() < _INT32.min or view.max() > _INT32.max):
        raise ValueError("a token id does not fit in int32")
    return view
