"""What a ``loader.DataLoader``'s ``stats()`` returns: its counts and stage times, totals over all its
workers and epochs, and what its cache holds (processes count them on a ``loader.stats.board.StatsBoard``).
"""

from __future__ import annotations

import dataclasses

from loader.coordinated.options import CoordinationStats

__all__ = ["LoaderStats"]


@dataclasses.dataclass(frozen=True)
class LoaderStats:
    """Totals over all workers and all epochs of one DataLoader.

    ``bytes_from_storage`` is what the kernel counted as read from the storage device by the loader's
    processes (``/proc/<pid>/io`` ``read_bytes``); ``bytes_from_source`` is what the sources returned, which
    includes reads served by the OS page cache. ``records_admitted`` counts admissions by this loader;
    ``records_cached`` is what the shared cache holds, from any job. ``files_passed`` counts a Dataset's opens
    for reading under ``cache_files`` that its ``open``'s replacement passed to the real one while the page
    cache held, or had room for, the files (``loader.serving.stepping_aside``; listed files or not; without
    workers, most such batches run with ``open`` not replaced, uncounted). ``records_corrupt`` counts cached
    records that failed their bounds or checksum check: each was read from the source instead, never served.
    ``memory_pauses`` counts the times a process stopped admitting for a while because memory was short.
    With ``partition_cache``, ``bytes_from_peers`` / ``peer_hits`` are the records other nodes' caches sent
    (the three sources of bytes: ``bytes_from_cache``, ``bytes_from_peers``, ``bytes_from_source``), and
    ``partition`` has the exchange's own counts. ``cache_sizing`` says how ``cache_bytes="auto"`` chose
    the capacity (empty for an explicit size the job can spare; why it was lowered where it could not),
    where memory ran short and admission paused below the capacity, the size the cache really reached, and
    where the job grew into the memory the cache keeps free, what the cache gave back and why
    (``cache_bytes_given_back``: its bytes, since the store was made); ``cache_form`` what form of record
    the cache holds (raw, prepared or mixed: its counts and sizes are its two stores' sums),
    ``cache_form_reason`` why, in
    numbers, and ``cache_form_epochs`` the steady epoch the loader predicted for each form it weighed (its
    own model, from the records it probed: seconds that rank the forms, not a forecast of the job's epoch).
    ``miss_seconds`` is the part of ``fetch_seconds`` spent reading the records the cache missed; where the
    cache can hold records prepared, each sample is counted by how it was made: from a prepared record
    (``samples_from_prepared``: its ``augment`` only), prepared from raw bytes to be held, then augmented
    (``samples_prepared``), or by the whole transform on raw bytes (``samples_whole``). The loader revisits
    its choice of form from these while its cache fills.
    """

    hits: int = 0
    misses: int = 0
    bytes_from_cache: int = 0
    bytes_from_source: int = 0
    bytes_from_storage: int = 0
    bytes_from_peers: int = 0
    peer_hits: int = 0
    records_admitted: int = 0
    files_passed: int = 0
    records_skipped: int = 0
    records_corrupt: int = 0
    memory_pauses: int = 0
    fetch_seconds: float = 0.0
    miss_seconds: float = 0.0
    decode_seconds: float = 0.0
    collate_seconds: float = 0.0
    batches_collated: int = 0
    samples: int = 0
    samples_from_prepared: int = 0
    samples_prepared: int = 0
    samples_whole: int = 0
    records_cached: int = 0
    cache_bytes_used: int = 0
    cache_capacity: int = 0
    cache_bytes_given_back: int = 0
    cache_sizing: str = ""
    cache_form: str = ""  # "raw", "prepared" or "mixed": what the cache holds ("" without a cache)
    cache_form_reason: str = ""  # why, with the measured numbers
    cache_form_epochs: dict[str, float] = dataclasses.field(default_factory=dict)  # the seconds weighed
    ready_first: bool = False  # batches made of the samples ready first (``DataLoader(ready_first=True)``)
    coordination: CoordinationStats | None = None
    partition: dict[str, float] | None = None

    @property
    def hit_rate(self) -> float:
        reads = self.hits + self.misses
        return self.hits / reads if reads else 0.0
