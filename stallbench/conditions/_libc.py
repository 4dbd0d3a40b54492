"""The C library calls ``conditions.storage`` needs that Python's ``os`` and ``mmap`` do not offer: a raw
mmap, munmap and mincore (which pages of a file are in the page cache)."""

from __future__ import annotations

import ctypes

__all__ = ["MAP_FAILED", "libc"]

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
MAP_FAILED = ctypes.c_void_p(-1).value
