"""Each sample's prep, timed where it is made: the ``dataset[index]`` calls of torch's map-style fetcher, in
every worker and in a main process that loads batches itself.

A sample that took ``SLOW`` times this process's running mean for its Dataset (and ``FLOOR`` or more) is
written down (a process's first ``WARM`` samples once its mean is known: a fresh worker's first ones too),
one appended line of ``OUT/samples-<pid>.jsonl`` each: the Dataset's ``id()`` (a forked worker's is its
parent's), the index, the seconds, when (``time.monotonic``: one clock for every process of the machine)
and the file it names where the Dataset says (``path_of``). At an epoch's end the measuring side reads the
lines of that loader's Dataset within the epoch's span (``slowest``). A Dataset with ``__getitems__`` makes
its batch in one call: its samples are not timed apart.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["FLOOR", "KEPT", "SLOW", "path_of", "slowest", "time_samples"]

SLOW = 4.0  # a sample this many times its process's running mean for the Dataset is written down
FLOOR = 0.001  # and at least this long
WARM = 16  # samples of the Dataset in the process before the mean is trusted
KEPT = 5  # the slowest an epoch's record keeps
ALL_KEPT = 1000  # and the index and time of that many of them: the next epoch tells whether the same are slow
_PATH_ATTRIBUTES = ("samples", "imgs", "paths", "files", "image_paths", "filenames")

_out: str | None = None
_armed_in = 0  # the process that called ``time_samples``
_means: dict[int, tuple[int, float]] = {}  # id(dataset): (samples timed, their mean seconds)
_early: dict[int, list[tuple[Any, float, float]]] = {}  # id(dataset): its first samples (index, s, when)


def time_samples(fetch_module: Any, out_dir: str) -> None:
    """Time ``fetch_module._MapDatasetFetcher.fetch``'s samples from now on, slow ones written in
    ``out_dir``."""
    global _out, _armed_in
    _out, _armed_in = out_dir, os.getpid()
    fetcher = fetch_module._MapDatasetFetcher
    original = fetcher.fetch
    if getattr(original, "__stallbench__", False):
        return

    @functools.wraps(original)
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        dataset = self.dataset
        if self.auto_collation:
            if getattr(dataset, "__getitems__", None):
                return original(self, possibly_batched_index)
            return self.collate_fn([_timed(dataset, index) for index in possibly_batched_index])
        return self.collate_fn(_timed(dataset, possibly_batched_index))

    fetch.__stallbench__ = True  # type: ignore[attr-defined]
    fetcher.fetch = fetch


def _timed(dataset: Any, index: Any) -> Any:
    start = time.perf_counter()
    sample = dataset[index]
    seconds = time.perf_counter() - start
    key = id(dataset)
    count, mean = _means.get(key, (0, 0.0))
    count, mean = count + 1, mean + (seconds - mean) / (count + 1)
    _means[key] = (count, mean)
    if count < WARM:  # the mean is not trusted yet: kept, and judged against it once it is
        _early.setdefault(key, []).append((index, seconds, time.monotonic()))
        return sample
    for early, took, at in _early.pop(key, ()):
        if took >= max(SLOW * mean, FLOOR):
            _write(key, early, took, path_of(dataset, early), at)
    if seconds >= max(SLOW * mean, FLOOR):
        _write(key, index, seconds, path_of(dataset, index), time.monotonic())
    return sample


def _write(key: int, index: Any, seconds: float, path: str | None, at: float) -> None:
    """One line, one ``write`` on a file opened to append: lines of several workers never interleave.
    Never raises: the script's sample is made whatever the writing does. Nothing from a process that
    multiprocessing started and that armed the timing itself: a spawned worker, whose Dataset is a copy with
    an ``id()`` no loader of the measured process has (a forked worker inherits its parent's timing)."""
    if _out is None or (_armed_in == os.getpid() and multiprocessing.parent_process() is not None):
        return
    index = index if isinstance(index, int) else repr(index)
    line = {"dataset": key, "index": index, "seconds": seconds, "at": at, "path": path}
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        fd = os.open(Path(_out) / f"samples-{os.getpid()}.jsonl", flags, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except (OSError, TypeError, ValueError):
        pass


def path_of(dataset: Any, index: Any) -> str | None:
    """The file sample ``index`` is read from, where the Dataset lists its files (an ``ImageFolder``'s
    ``samples``, a ``paths`` or ``files`` list; through a ``Subset``); None where it does not say."""
    if hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # a Subset
        try:
            return path_of(dataset.dataset, dataset.indices[index])
        except (IndexError, KeyError, TypeError):
            return None
    for name in _PATH_ATTRIBUTES:
        try:
            item = getattr(dataset, name)[index]
        except (AttributeError, IndexError, KeyError, TypeError):
            continue
        item = item[0] if isinstance(item, (tuple, list)) and item else item
        if isinstance(item, (str, os.PathLike)):
            return os.fspath(item)
    return None


def slowest(out_dir: str, dataset: int, start: float, end: float) -> dict[str, Any]:
    """The slow samples written down for Dataset ``dataset`` (its ``id()``) between ``start`` and ``end``
    (``time.monotonic``), as a LoaderEpoch's fields: how many, the ``KEPT`` slowest as
    ``[index, seconds, path]``, and ``[index, seconds]`` of the ``ALL_KEPT`` slowest."""
    found = []
    for path in Path(out_dir).glob("samples-*.jsonl"):
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for text in lines:
            try:
                line = json.loads(text)
            except ValueError:  # a line a killed worker cut short
                continue
            if line.get("dataset") == dataset and start <= line.get("at", -1.0) <= end:
                found.append([line["index"], line["seconds"], line.get("path")])
    found.sort(key=lambda f: -f[1])
    times: dict[int, float] = {}
    for index, seconds, _ in found:  # the slowest first: a sample timed twice keeps its slower time
        if type(index) is int and len(times) < ALL_KEPT:
            times.setdefault(index, seconds)
    slow_times = [[index, seconds] for index, seconds in times.items()]
    return {"slow_sample_count": len(found), "slow_samples": found[:KEPT], "slow_times": slow_times}
