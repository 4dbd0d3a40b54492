"""The form of record revisited while the cache fills (``cache_form="auto"``).

The form is first chosen from eight records probed in the main process when the loader is made
(``loader.form.choice``). The job's own records may cost otherwise: storage slower or faster than the probe
saw it, the page cache holding the data or not, a CPU shared with the training step. So after every doubling
of the records the job has read (a sixteenth of the dataset, then an eighth, a quarter, ...), the main process
weighs the forms again with what the loader measured so far (``stats()``: the seconds of its misses, of each
way a sample was made, and the bytes the kernel read from the device) and, where another split of the room is
predicted at least 10% shorter than the split held, moves the two stores' limits (``MinIOCache.set_limit``).
Records already held stay as they are (a store never evicts); the room not yet filled goes to the form now
chosen. It stops once the stores are full: nothing is left to redirect.
"""

from __future__ import annotations

import dataclasses

from loader.cache import MinIOCache, index_bytes
from loader.form.weighing import PREPARED_GAIN, FormChoice, Probe, held_epoch, weigh
from loader.stats.board import StatsBoard
from loader.stats.loader_stats import LoaderStats
from loader.system.locks import LockTimeout

__all__ = ["FormRevisit", "measured"]

FIRST = 16  # the first revisit after 1/FIRST of the dataset's records were read
MEASURED = 16  # the fewest records of a kind whose measured cost replaces the probe's
EVERY = 8  # batches handed out between two looks at the records read


def measured(probe: Probe, t: LoaderStats) -> Probe:
    """``probe`` with what ``t`` measured on the job's own records: a miss's fetch and size (a mean: what
    a store's limit holds), the CPU of making a sample (scaled from the probe: each way of making one, timed,
    against what the probe predicts for those ways; the stages keep the probe's proportions) and the share
    of the bytes read from the device."""
    misses = t.misses >= MEASURED and t.bytes_from_source > 0
    fetch = t.miss_seconds / t.misses if misses else probe.fetch
    raw_bytes = t.bytes_from_source / t.misses if misses else probe.raw_bytes
    ways = (
        (t.samples_from_prepared, probe.unpack + probe.augment),
        (t.samples_prepared, probe.prepare + probe.augment),
        (t.samples_whole, probe.whole),
    )
    predicted = sum(count * seconds for count, seconds in ways)
    made = sum(count for count, _ in ways)
    cpu = t.decode_seconds / predicted if made >= MEASURED and predicted > 0 else 1.0
    from_storage = t.bytes_from_storage / t.bytes_from_source if misses else probe.from_storage
    return dataclasses.replace(
        probe,
        fetch=fetch,
        raw_bytes=raw_bytes,
        prepare=probe.prepare * cpu,
        augment=probe.augment * cpu,
        whole=probe.whole * cpu,
        unpack=probe.unpack * cpu,
        from_storage=min(1.0, from_storage),
    )


class FormRevisit:
    """The main process's side: told of each batch handed out (``handed``), it revisits ``choice`` at each
    doubling of the records read, moving the limits of the ``raw`` and ``prepared`` stores."""

    def __init__(
        self, choice: FormChoice, raw: MinIOCache, prepared: MinIOCache, records: int, workers: int
    ) -> None:
        self.choice, self.raw, self.prepared = choice, raw, prepared
        self.records, self.workers = records, workers
        self.room = min(raw.capacity, prepared.capacity) - index_bytes(records)  # each store's file
        self.revisits = 0  # times the split was moved
        self._next, self._batches, self.done = max(1, records // FIRST), 0, False

    def handed(self, board: StatsBoard) -> None:
        """A batch was handed out: every ``EVERY`` batches, revisit where the records read reached the next
        point. Cheap: a count, and at most a look at the board's two counters."""
        self._batches += 1
        if self.done or self._batches % EVERY:
            return
        if board.count("hits", "misses") >= self._next:
            self._next *= 2
            self.revisit(board.totals())

    def revisit(self, totals: LoaderStats) -> None:
        """Weigh the forms with ``totals``' measurements; move the split where another is at least 10%
        shorter. Done once the stores hold all the room (or every record)."""
        raw, prepared = self.raw.info(), self.prepared.info()
        if (raw.full and prepared.full) or raw.records_cached + prepared.records_cached >= self.records:
            self.done = True
            return
        probe = self.choice.probe
        assert probe is not None  # a split cache is opened only where records were probed
        m = measured(probe, totals)
        held = held_epoch(m, self.records, self.workers, self.prepared.limit, self.raw.limit)
        weighed = weigh(m, self.records, self.room, self.workers, index_bytes(self.records))
        if not weighed.epochs[weighed.form] < PREPARED_GAIN * held:
            return
        share = {"raw": 0, "prepared": self.room, "mixed": weighed.prepared_room}[weighed.form]
        try:
            given = self.prepared.set_limit(min(share, self.room - self.raw.used))
            self.raw.set_limit(self.room - given)
        except LockTimeout:  # a process holds a store's lock (stopped, say): the next point tries again
            return
        self.revisits += 1
        seen = totals.hits + totals.misses
        why = f"revisited after {seen} records read (held split predicted {held:.2f} s): {weighed.reason}"
        self.choice = dataclasses.replace(weighed, reason=why)
