"""A collated batch as a file in the staging area, read back without pickle and, for tensors, without a copy.

Layout: ``MAGIC`` | header length (u32) | header CRC32 (u32) | header (JSON) | padding | tensor bytes. The
header holds the batch's structure (tuples, lists, dicts, numbers, strings; each tensor as ``{"t": k}``), each
tensor's dtype, shape, offset and length, and the xxh3-64 of the tensor bytes. A reader checks the magic, both
checksums and every extent against the file's size before it makes a tensor, and maps the file copy-on-write:
the tensors are views of the mapping (writable, as a collated batch is), which outlives the file's removal.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import torch
import xxhash

__all__ = ["BadBatchFile", "read_batch", "write_batch"]

MAGIC = b"SBBATCH1"
_PREFIX = struct.Struct("<8sII")
_ALIGN = 64
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


class BadBatchFile(ValueError):
    """A staged batch failed its checks (damaged, truncated, or not one of ours): never served."""


def write_batch(fd: int, batch: Any) -> int:
    """Write ``batch`` to the open file ``fd``; return the bytes written."""
    tensors: list[torch.Tensor] = []
    structure = _encode(batch, tensors)
    table, offset, digest = [], 0, xxhash.xxh3_64()
    for t in tensors:
        raw = _raw_bytes(t)
        table.append([str(t.dtype).removeprefix("torch."), list(t.shape), offset, raw.nbytes])
        digest.update(raw)
        digest.update(bytes(_aligned(raw.nbytes) - raw.nbytes))
        offset += _aligned(raw.nbytes)
    header = {"batch": structure, "tensors": table, "data_hash": digest.intdigest(), "data_len": offset}
    header = json.dumps(header).encode()
    start = _aligned(_PREFIX.size + len(header))
    head = _PREFIX.pack(MAGIC, len(header), zlib.crc32(header)) + header
    with os.fdopen(os.dup(fd), "wb") as out:
        out.write(head + bytes(start - len(head)))
        for t, row in zip(tensors, table, strict=True):
            out.write(_raw_bytes(t))
            out.write(bytes(_aligned(row[3]) - row[3]))
    return start + offset


def read_batch(fd: int, name: str) -> Any:
    """The batch in the open file ``fd`` (``name`` names it in errors), its tensors mapped, not copied."""
    size = os.fstat(fd).st_size
    if size < _PREFIX.size:
        raise BadBatchFile(f"staged batch {name} is truncated ({size} bytes)")
    mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    magic, length, header_crc = _PREFIX.unpack_from(mapped)
    start = _aligned(_PREFIX.size + length)
    if magic != MAGIC or start > size:
        raise BadBatchFile(f"staged batch {name} is not a batch file, or is truncated")
    view = memoryview(mapped)
    header_bytes = view[_PREFIX.size : _PREFIX.size + length]
    if zlib.crc32(header_bytes) != header_crc:
        raise BadBatchFile(f"staged batch {name} has a damaged header")
    header = json.loads(bytes(header_bytes))
    if start + header["data_len"] != size or xxhash.xxh3_64_intdigest(view[start:]) != header["data_hash"]:
        raise BadBatchFile(f"staged batch {name} has damaged or missing tensor bytes")
    tensors = list(_tensors(mapped, start, header["tensors"], size, name))
    return _decode(header["batch"], tensors)


def _tensors(mapped: mmap.mmap, start: int, table: list, size: int, name: str) -> Iterator[torch.Tensor]:
    for dtype_name, shape, offset, nbytes in table:
        dtype = _DTYPES.get(dtype_name)
        numel = int(torch.tensor(shape, dtype=torch.int64).prod()) if shape else 1
        if dtype is None or numel * dtype.itemsize != nbytes or start + offset + nbytes > size:
            raise BadBatchFile(f"staged batch {name} describes a tensor it does not hold")
        if nbytes == 0:
            yield torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=start + offset)
        yield flat.view(dtype).reshape(shape)


def _raw_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _encode(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        if str(value.dtype).removeprefix("torch.") not in _DTYPES:
            raise TypeError(f"coordinate: a batch tensor of dtype {value.dtype} cannot be staged")
        tensors.append(value)
        return {"t": len(tensors) - 1}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    if isinstance(value, (tuple, list)):
        return {"tuple" if isinstance(value, tuple) else "list": [_encode(v, tensors) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": [[k, _encode(v, tensors)] for k, v in value.items()]}
    raise TypeError(
        f"coordinate: a collated batch holding {type(value).__name__} cannot be shared between jobs "
        "(tensors, numbers, strings, None, and tuples, lists and str-keyed dicts of them can)"
    )


def _decode(node: dict, tensors: list[torch.Tensor]) -> Any:
    if "t" in node:
        return tensors[node["t"]]
    if "v" in node:
        return node["v"]
    if "tuple" in node:
        return tuple(_decode(v, tensors) for v in node["tuple"])
    if "list" in node:
        return [_decode(v, tensors) for v in node["list"]]
    return {k: _decode(v, tensors) for k, v in node["dict"]}
