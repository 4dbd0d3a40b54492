"""Data in object storage (``--data s3://bucket/prefix``): what an analysis does differently for it.

Its reads come over the network, which the kernel's count of a disk's reads does not see: a job counts what
its source fetched instead (``bytes_from_source``: the objects' bytes, as the network carried them), the
dataset's size is the objects' sizes from the listing, and the storage bandwidth of the model is the
network's, measured here by GETs of a random sample of objects with as many requests in flight as the job
has workers (as the disk's probe reads with as many readers). There is no page cache to warm or evict: the
prep run, whose records must all be in memory, reads a copy of the objects made in a private folder in
``/dev/shm`` before the runs (the memory a warm page cache would take) and removed after; the cold run
reads the bucket itself, with our cache empty. Objects are read through our loader's own source
(``loader.ImageFolder``), so the listing, the records and their errors are the ones the job sees.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stallbench.conditions.sizes import format_bytes
from stallbench.jobs.object_copies import download
from stallbench.jobs.run import scratch_cache_dir

__all__ = ["COPY_SHARE", "check_room_for_copies", "in_memory_copy", "network_bandwidth", "object_source"]

COPY_SHARE = 0.5  # of the memory the analysis may take, at most this for the copies in /dev/shm
_PROBE_BYTES, _PROBE_SECONDS = 128 << 20, 4.0  # the network probe reads at most this, or about this long


def object_source(url: str) -> Any:
    """The image folder under ``url`` as the job's source opens it: listed once, here."""
    import loader

    return loader.ImageFolder(url, transform=None).source


def network_bandwidth(source: Any, readers: int = 1, seed: int = 0) -> float:
    """Bytes/s of whole-object GETs of a random sample of ``source``'s objects, ``readers`` at once:
    128 MB at most, or about 4 seconds' worth (reads are handed out a few at a time, so none starts past
    the deadline)."""
    order = list(range(len(source)))
    random.Random(seed).shuffle(order)
    readers = max(1, readers)
    total, start = 0, time.perf_counter()
    with ThreadPoolExecutor(readers) as pool:
        for first in range(0, len(order), readers):
            total += sum(pool.map(lambda i: len(source.read(i)), order[first : first + readers]))
            if total >= _PROBE_BYTES or time.perf_counter() - start >= _PROBE_SECONDS:
                break
    return total / (time.perf_counter() - start)


def check_room_for_copies(url: str, nbytes: int, converted: int) -> None:
    """ValueError, before any run, where the prep run's copy of the ``nbytes`` objects at ``url`` in
    ``/dev/shm``, and one copy in its own format for each of the ``converted`` loaders that read one, would
    take more than ``COPY_SHARE`` of the memory this process may still take or of ``/dev/shm``'s free room:
    pages in ``/dev/shm`` are memory the kernel cannot take back, and the jobs need the rest."""
    from loader.system import memory_view

    needed = nbytes * (1 + converted)
    view, free = memory_view(), shutil.disk_usage("/dev/shm").free
    room = min(view.headroom, free)
    if needed > COPY_SHARE * room:
        what = "the objects" + (f" and {converted} converted copies of them" if converted else "")
        left = f"{view.source}: {format_bytes(view.headroom)}; /dev/shm free: {format_bytes(free)}"
        raise ValueError(
            f"--data {url}: the prep run reads a copy in /dev/shm ({what}: {format_bytes(needed)}), more "
            f"than {COPY_SHARE:.0%} of the {format_bytes(room)} left ({left}); analyze a smaller prefix or "
            "fewer --loaders"
        )


@contextlib.contextmanager
def in_memory_copy(source: Any) -> Iterator[Path]:
    """The objects of ``source`` copied, in their layout (``<class>/<key>``), to a private folder in
    ``/dev/shm``; removed when done, or by a later run if this one is killed (``scratch_cache_dir``)."""
    root = scratch_cache_dir("/dev/shm")
    folder = root / "data"
    try:
        download(source, folder)
        yield folder
    finally:
        shutil.rmtree(root, ignore_errors=True)
