"""Which form of record the cache holds, raw bytes, prepared, or a mix (``cache_form``), chosen by
measurement.

A few records, spread over the dataset, are read, prepared, augmented and transformed whole, each timed, and
the prepared form's size and the time to read it back from the store (its checksum and a copy) taken
(``probe``); ``loader.form.weighing`` predicts each form's steady epoch from those and
the cache's room. The form with the shortest epoch is held, prepared or mixed only where it is at least 10%
shorter than raw (a tie keeps raw bytes, which serve any transform). A form the user forces is weighed
all the same, so that ``stats().cache_form_epochs`` says what the others would take. The choice is made
once, when the loader is made; ``stats().cache_form_reason`` gives its numbers.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from typing import Any

import numpy as np
import torch

from loader.cache._layout import checksum, index_bytes
from loader.fetching.staged import decode_prepared, encode_prepared, is_staged
from loader.form.weighing import FormChoice, Probe, weigh
from loader.system.counters import own_read_bytes

__all__ = ["FORMS", "choose_form", "probe"]

FORMS = ("auto", "raw", "prepared")
PROBE_RECORDS = 8


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
    probed = sorted({k * n // count for k in range(min(count, n))})
    if n - 1 not in probed:  # untimed: what a first call loads (decoder plugins, lazy imports) reads and
        with contextlib.suppress(ValueError, OSError):  # costs once, and is not a record's
            _time_one(source, transform, n - 1)
    rows = []
    device = own_read_bytes()
    for index in probed:
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
    stored = encode_prepared(prepared)
    unpacking = time.perf_counter()
    checksum(index, stored)
    decode_prepared(stored)
    unpacked = time.perf_counter()
    timed = fetched - start, made - fetched, augmented - made, whole - augmented
    return *timed, len(raw), len(stored), unpacked - unpacking


_PROBED: dict[tuple[str, str], Probe | None] = {}


def _probed(dataset: Any) -> Probe | None:
    """The probe of this data and preparation, made once per process: a script that builds a loader again
    (an evaluation loader at every ``evaluate()``, as Hugging Face's Trainer does) does not read and
    prepare its records again each time."""
    key = (dataset.source.fingerprint, dataset.transform.identity)
    if key not in _PROBED:
        _PROBED[key] = probe(dataset)
    return _PROBED[key]


def choose_form(dataset: Any, form: str, room: int, workers: int) -> FormChoice:
    """The form to hold (``form``: "auto", "raw" or "prepared") with ``room`` bytes for records and
    ``workers`` DataLoader workers. A staged transform's records are probed and each form weighed even
    where the form is forced: the choice's ``epochs`` tell what the other forms would take (stallbench's
    what-if reads them), and a prepared record's size sizes an "auto" cache."""
    if form not in FORMS:
        raise ValueError(f"cache_form must be one of {', '.join(map(repr, FORMS))}, got {form!r}")
    staged = is_staged(dataset.transform)
    if form == "prepared" and not staged:
        raise ValueError(
            f"cache_form='prepared' needs a staged transform (transform='train', 'eval' or a "
            f"loader.StagedTransform with an identity), not {dataset.transform!r}: nothing says which part "
            "is deterministic"
        )
    if not staged:
        why = "asked for" if form == "raw" else "the transform is one stage: only raw bytes can be cached"
        return FormChoice("raw", why)
    measured = _probed(dataset)
    if measured is None:
        why = f"none of {PROBE_RECORDS} records probed could be prepared"
        return FormChoice(form if form != "auto" else "raw", why if form == "auto" else f"asked for ({why})")
    weighed = weigh(measured, len(dataset), room, workers, index_bytes(len(dataset)))
    if form == "auto":
        return weighed
    why = f"asked for; weighed: {weighed.reason}"
    return FormChoice(form, why, measured.prepared_bytes, epochs=weighed.epochs, probe=measured)
