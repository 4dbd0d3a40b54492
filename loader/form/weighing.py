"""How long a steady epoch takes with the cache's room filled each way (raw bytes, prepared records, or a
mix), from what the probe measured per record (``loader.form.choice``): the model behind
``cache_form="auto"``.

A raw hit saves the fetch; a prepared hit saves the fetch and ``prepare``, but a prepared record is bigger,
so fewer fit. A mix holds some records prepared and the rest raw, in two stores. The CPU work of an epoch
runs on ``min(workers, cores)`` lanes and the fetches of its misses on ``workers``; the epoch is the longer
of the two (they overlap). Fetch-bound jobs keep raw bytes, prep-bound jobs with memory to spare get
prepared records, with less memory a mix. Where the probed records came from the page cache, a miss's read
from storage was not timed, so no form that holds fewer records than raw (more misses) is chosen.
"""

from __future__ import annotations

import dataclasses
import os

__all__ = ["PREPARED_GAIN", "FormChoice", "Probe", "held_epoch", "weigh"]

PREPARED_GAIN = 0.9  # prepared (or mixed) only where its predicted epoch is below this fraction of raw's
MIX_STEPS = 512  # splits of the room tried for a mix of the two forms
RAW_SPARE = 1.1  # a mix plans raw records 10% bigger than the probe's median: sizes vary
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
    unpack: float = 0.0  # a prepared hit read back: its checksum and a fresh copy of its arrays
    from_storage: float = 1.0  # of the probed records' bytes, the share the kernel read from the device


@dataclasses.dataclass(frozen=True)
class FormChoice:
    form: str  # "raw", "prepared" or "mixed" (some records prepared, the rest raw, in two stores)
    reason: str
    prepared_bytes: float = 0.0  # a prepared record's size, measured (0: not probed)
    prepared_room: int = 0  # mixed: the bytes of records the prepared store takes; the raw store the rest
    epochs: dict[str, float] = dataclasses.field(default_factory=dict)  # predicted steady epoch per form
    probe: Probe | None = None  # what it was weighed from (None: nothing was probed)


def weigh(m: Probe, records: int, room: float, workers: int, index: int = 0) -> FormChoice:
    """The form with the shortest predicted steady epoch in ``room`` bytes (a mix has two stores: ``index``
    bytes less, the second store's index)."""
    epochs = _Epochs(m, records, workers)
    fits_raw = min(records, int(room // max(m.raw_bytes, 1)))
    fits_prepared = min(records, int(room // max(m.prepared_bytes, 1)))
    raw = epochs.held(0, fits_raw)
    prepared = epochs.held(fits_prepared, 0)
    untimed = m.from_storage < TIMED_STORAGE  # a miss's read from storage was not timed
    mix = _best_mix(epochs, room - index, records - fits_raw if untimed else records)
    choices = [] if untimed and fits_prepared < fits_raw else [("prepared", prepared, fits_prepared)]
    choices += [("mixed", mix[0], mix[1])] if mix is not None else []
    form, best, held_prepared = min(choices, key=lambda c: c[1], default=("raw", raw, 0))
    if not best < PREPARED_GAIN * raw:
        form, held_prepared = "raw", 0
    reason = (
        f"predicted steady epoch {prepared:.2f} s prepared against {raw:.2f} s raw; per record fetch "
        f"{m.fetch * 1e3:.2f} ms, prepare {m.prepare * 1e3:.2f} ms, unpack {m.unpack * 1e3:.2f} ms, "
        f"augment {m.augment * 1e3:.2f} ms, whole transform {m.whole * 1e3:.2f} ms, "
        f"{m.raw_bytes / 1e3:.0f} kB raw, {m.prepared_bytes / 1e3:.0f} kB prepared; "
        f"{fits_prepared} of {records} fit prepared, {fits_raw} raw"
    )
    if mix is not None:
        reason += f"; mixed {mix[0]:.2f} s with {mix[1]} prepared and {mix[2]} raw"
    if untimed and fits_prepared < fits_raw:
        reason += (
            f"; prepared alone not weighed: the probed records came from the page cache "
            f"({m.from_storage:.0%} from the device), so the storage reads of the {fits_raw - fits_prepared} "
            "more misses prepared would make were not timed"
        )
    prepared_room = int(held_prepared * m.prepared_bytes) if form == "mixed" else 0
    predicted = {"raw": raw, "prepared": prepared} | ({"mixed": mix[0]} if mix is not None else {})
    return FormChoice(form, reason, m.prepared_bytes, prepared_room, predicted, m)


def held_epoch(m: Probe, records: int, workers: int, prepared_room: float, raw_room: float) -> float:
    """The steady epoch predicted for ``prepared_room`` bytes of prepared records and ``raw_room`` of raw
    ones (the prepared store filled first, as a mix fills)."""
    prepared = min(records, int(prepared_room // max(m.prepared_bytes, 1)))
    raw = min(records - prepared, int(raw_room // max(m.raw_bytes, 1)))
    return _Epochs(m, records, workers).held(prepared, raw)


class _Epochs:
    """A steady epoch predicted from a probe: the CPU work on ``min(workers, cores)`` lanes, the fetches of
    the misses on ``workers``, the longer of the two."""

    def __init__(self, m: Probe, records: int, workers: int) -> None:
        self.m, self.records, self.workers = m, records, max(workers, 1)
        self.lanes = max(1, min(workers, len(os.sched_getaffinity(0))))

    def held(self, prepared: int, raw: int) -> float:
        """``prepared`` records held prepared (a hit costs ``unpack`` and ``augment``) and ``raw`` held raw;
        every other record runs the whole transform, as an uncached epoch does (raw bytes alone:
        ``held(0, raw)``)."""
        m, records = self.m, self.records
        cpu = prepared * (m.unpack + m.augment) + (records - prepared) * m.whole
        return self._longer(cpu, records - prepared - raw)

    def _longer(self, cpu: float, misses: int) -> float:
        return max(cpu / self.lanes, misses * self.m.fetch / self.workers)


def _best_mix(epochs: _Epochs, room: float, most_misses: int) -> tuple[float, int, int] | None:
    """The split of ``room`` between prepared and raw records with the shortest epoch, as (epoch, prepared,
    raw), both kinds held and at most ``most_misses`` misses; None where no such split exists.

    The epoch is piecewise linear in the prepared share (the CPU falls, the misses rise once raw records no
    longer all fit), so a fine grid with the point where the raw records just fit finds its least."""
    m, records = epochs.m, epochs.records
    raw_bytes = max(m.raw_bytes, 1) * RAW_SPARE
    most = min(records, int(room // max(m.prepared_bytes, 1)))
    points = {most * k // MIX_STEPS for k in range(MIX_STEPS + 1)}
    if m.prepared_bytes > raw_bytes:
        all_raw_fit = (room - records * raw_bytes) / (m.prepared_bytes - raw_bytes)
        points |= {int(all_raw_fit), int(all_raw_fit) + 1}
    best = None
    for prepared in sorted(p for p in points if 0 < p <= most):
        raw = min(records - prepared, int((room - prepared * m.prepared_bytes) // raw_bytes))
        if raw <= 0 or records - prepared - raw > most_misses:
            continue
        epoch = epochs.held(prepared, raw)
        if best is None or epoch < best[0]:
            best = (epoch, prepared, raw)
    return best
