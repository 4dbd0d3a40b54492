"""Ingestion's batches: a loader's first batches, made in the script's own process with no worker started,
handed out again as a fresh copy for every later batch (in shared memory where the loader has workers), so
the script's step runs on real batches while loading costs next to nothing, which is the step alone. The
copies matter: a script that edits its batch in place would otherwise change the batches it is handed later.
"""

from __future__ import annotations

import itertools
from typing import Any

from stallbench.jobs._fresh import fresh_copy
from stallbench.jobs._timed import say

__all__ = ["ReplayIterator", "replay_for", "replay_length", "take_batches"]


def replay_for(state: Any, dl: Any, spec: Any) -> ReplayIterator | None:
    """An ingestion epoch of ``dl`` (``state``: its ``LoaderState``): its first batches, taken once, handed
    out as many times as the prep run's epoch made batches; None where they cannot be made without workers
    (the loader then runs as a pipeline)."""
    if state.replay is None:
        try:
            state.replay = take_batches(dl, spec.replay_batches)
        except Exception as exc:
            say(f"cannot make {state.id}'s batches without workers ({exc!r}); it runs as a pipeline")
            state.mode = "pipeline"
            return None
    recorded = spec.replay_lengths.get(state.id, ())
    epoch = recorded[min(state.epochs, len(recorded) - 1)] if recorded else None
    length = replay_length(dl, spec.steps, spec.replay_batches, state.id, epoch)
    return ReplayIterator(state.replay, length, shared=dl.num_workers > 0)


def take_batches(dl: Any, count: int) -> list[Any]:
    """``dl``'s first ``count`` batches (fewer if it has fewer), made in this process: ``num_workers`` is 0
    while torch's iterator is made, so no worker starts, and is restored before anything else sees it."""
    workers = dl.num_workers
    dl.num_workers = 0
    try:
        iterator = dl._get_iterator()
    finally:
        dl.num_workers = workers
    return list(itertools.islice(iterator, count))


def replay_length(
    dl: Any, steps: int | None, fallback: int, name: str, recorded: int | None = None
) -> int | None:
    """Batches per ingestion epoch: as many as torch's iterator would hand out, cut to ``steps``.

    A map-style loader's come from its index sampler, as torch's iterator counts them; None (no end) where
    the sampler has no length (one that never ends, or one kept across epochs). An iterable Dataset's come
    from the prep run (``recorded``: that epoch's batches), else its length; failing both, ``fallback``,
    with one line saying so.
    """
    if _is_map_style(dl):
        length = _length(dl._index_sampler)
    else:
        length = recorded if recorded is not None else _length(dl)
        if length is None and steps is None:
            say(f"{name} has no length and no recorded epoch: ingestion hands out {fallback} batches", name)
            length = fallback
    if steps is not None:
        return steps if length is None else min(steps, length)
    return length


def _is_map_style(dl: Any) -> bool:
    from torch.utils.data.dataloader import _DatasetKind

    return getattr(dl, "_dataset_kind", _DatasetKind.Map) == _DatasetKind.Map


def _length(sized: Any) -> int | None:
    try:
        return len(sized)
    except TypeError:
        return None


class ReplayIterator:
    """``length`` batches (None: no end) cycling over ``batches``, each a fresh copy (in shared memory with
    ``shared``: where the loader's batches come from workers, as ``_fresh`` says why)."""

    def __init__(self, batches: list[Any], length: int | None, shared: bool = False) -> None:
        self._batches, self._length, self._next = batches, length if batches else 0, 0
        self._shared = shared

    def __iter__(self) -> ReplayIterator:
        return self

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("this replay has no end, as the loader's own iterator")
        return self._length

    def __next__(self) -> Any:
        if self._length is not None and self._next >= self._length:
            raise StopIteration
        batch = self._batches[self._next % len(self._batches)]
        self._next += 1
        return fresh_copy(batch, self._shared)
