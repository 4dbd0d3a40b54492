"""Which form of record the cache holds, raw bytes or prepared (``cache_form``), chosen by measurement.

A few records, spread over the dataset, are read, prepared, augmented and transformed whole, each timed, and
the prepared form's size taken. The steady epoch of each form is then predicted from the cache's room: a
raw hit saves the fetch; a prepared hit saves the fetch and ``prepare``, but a prepared record is bigger
(decoded pixels are ~5-10x their JPEG), so fewer fit. The CPU work of an epoch runs on ``min(workers,
cores)`` lanes and the fetches of its misses on ``workers``; the epoch is the longer of the two. The form
with the shorter epoch is held, prepared only where it is at least 10% shorter (a tie keeps raw bytes, which
serve any transform). Fetch-bound jobs keep raw bytes, prep-bound jobs with memory to spare get prepared
records. Where the probed records came from the page cache, the fetch of a miss from storage was not timed,
so a prepared form that would hold fewer records than raw (more misses) is not chosen. The choice is made
once, when the loader is made; ``stats().cache_form_reason`` gives its numbers.
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time
from typing import Any

import numpy as np
import torch

from loader.staged import encode_prepared, is_staged
from loader.system.counters import own_read_bytes

__all__ = ["FORMS", "FormChoice", "choose_form", "probe"]

FORMS = ("auto", "raw", "prepared")
PROBE_RECORDS = 8
PREPARED_GAIN = 0.9  # prepared only where its predicted epoch is below this fraction of raw's
TIMED_STORAGE = 0.5  # a probe that read less of its bytes from the device timed the page cache, not storage


@dataclasses.dataclass(frozen=True)
class Probe:
    """Per record, medians over the probed records: seconds and bytes."""

    fetch: float
    prepare: float
    augment: float
    whole: float  # the transform called on raw bytes, as an uncached epoch runs it
    raw_bytes: float
    prepared_bytes: float
    from_storage: float = 1.0  # of the probed records' bytes, the share the kernel read from the device


@dataclasses.dataclass(frozen=True)
class FormChoice:
    form: str  # "raw" or "prepared"
    reason: str
    prepared_bytes: float = 0.0  # a prepared record's size, measured (0: not probed)


def probe(dataset: Any, count: int = PROBE_RECORDS) -> Probe | None:
    """Time ``count`` records spread over ``dataset`` (a SourceDataset with a staged transform). The random
    modules' states are put back after: the script's own draws stay as torch's loader leaves them. None
    where no probed record could be prepared."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        return _probe(dataset, count)
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _probe(dataset: Any, count: int) -> Probe | None:
    source, transform = dataset.source, dataset.transform
    n = len(source)
    rows = []
    device = own_read_bytes()
    for index in sorted({k * n // count for k in range(min(count, n))}):
        try:
            rows.append(_time_one(source, transform, index))
        except (ValueError, OSError):  # a bad record: the loader names it when it comes (on_error)
            continue
    if not rows:
        return None
    share = (own_read_bytes() - device) / max(1, sum(row[4] for row in rows))
    return Probe(*(statistics.median(column) for column in zip(*rows, strict=True)), from_storage=share)


def _time_one(source: Any, transform: Any, index: int) -> tuple[float, ...]:
    start = time.perf_counter()
    raw = source.read(index)
    fetched = time.perf_counter()
    prepared = transform.prepare(raw)
    made = time.perf_counter()
    transform.augment(prepared)
    augmented = time.perf_counter()
    transform(raw)
    whole = time.perf_counter()
    size = len(encode_prepared(prepared))
    return fetched - start, made - fetched, augmented - made, whole - augmented, len(raw), size


def choose_form(dataset: Any, form: str, room: int, workers: int, sizing: bool = False) -> FormChoice:
    """The form to hold (``form``: "auto", "raw" or "prepared") with ``room`` bytes for records and
    ``workers`` DataLoader workers; ``sizing``: the cache is sized from the form's records ("auto"), so a
    prepared record's size is measured even where the form is forced."""
    if form not in FORMS:
        raise ValueError(f"cache_form must be one of {', '.join(map(repr, FORMS))}, got {form!r}")
    staged = is_staged(dataset.transform)
    if form == "prepared" and not staged:
        raise ValueError(
            f"cache_form='prepared' needs a staged transform (transform='train', 'eval' or a "
            f"loader.StagedTransform with an identity), not {dataset.transform!r}: nothing says which part "
            "is deterministic"
        )
    if form == "raw" or not staged:
        why = "asked for" if form == "raw" else "the transform is one stage: only raw bytes can be cached"
        return FormChoice("raw", why)
    measured = probe(dataset) if form == "auto" or sizing else None
    if form == "prepared":
        return FormChoice("prepared", "asked for", measured.prepared_bytes if measured else 0.0)
    if measured is None:
        return FormChoice("raw", f"none of {PROBE_RECORDS} records probed could be prepared")
    return _weigh(measured, len(dataset), room, workers)


def _weigh(m: Probe, records: int, room: float, workers: int) -> FormChoice:
    lanes = max(1, min(workers, len(os.sched_getaffinity(0))))
    fits_raw = min(records, int(room // max(m.raw_bytes, 1)))
    fits_prepared = min(records, int(room // max(m.prepared_bytes, 1)))
    raw = max(records * m.whole / lanes, (records - fits_raw) * m.fetch / max(workers, 1))
    cpu = fits_prepared * m.augment + (records - fits_prepared) * (m.prepare + m.augment)
    prepared = max(cpu / lanes, (records - fits_prepared) * m.fetch / max(workers, 1))
    form = "prepared" if prepared < PREPARED_GAIN * raw else "raw"
    untimed = fits_prepared < fits_raw and m.from_storage < TIMED_STORAGE
    if untimed:  # the misses prepared adds would be read at a cost the probe did not see
        form = "raw"
    reason = (
        f"predicted steady epoch {prepared:.2f} s prepared against {raw:.2f} s raw; per record fetch "
        f"{m.fetch * 1e3:.2f} ms, prepare {m.prepare * 1e3:.2f} ms, augment {m.augment * 1e3:.2f} ms, whole "
        f"transform {m.whole * 1e3:.2f} ms, {m.raw_bytes / 1e3:.0f} kB raw, {m.prepared_bytes / 1e3:.0f} kB "
        f"prepared; {fits_prepared} of {records} fit prepared, {fits_raw} raw"
    )
    if untimed:
        reason += (
            f"; raw kept: the probed records came from the page cache ({m.from_storage:.0%} from the "
            f"device), so the storage reads of the {fits_raw - fits_prepared} more misses prepared would "
            "make were not timed"
        )
    return FormChoice(form, reason, m.prepared_bytes)
