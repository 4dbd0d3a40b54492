"""The rest of an epoch of torch's ``DistributedSampler`` dealt again among another number of ranks: a job
saved with 2 ranks and restarted with 3 gets each sample the saved epoch had not reached once.

``DistributedSampler`` deals one order of the whole dataset (drawn from ``seed + epoch``, the same on every
rank) round-robin: rank ``r`` of ``W`` gets positions ``r, r + W, ...``. Ranks step in lockstep under DDP, so
when each has handed out ``p`` batches of ``B``, exactly the first ``p * B * W`` positions of that order were
reached. The order itself is drawn by torch's own sampler (a copy of it as the only rank), and what is left
is dealt as torch deals a whole epoch: round-robin, padded (repeating its start) so every rank gets as many,
or cut where ``drop_last``. What the epoch has dealt so far is kept with the loader's state (``Dealt``), so a
job resumed twice, under 2, then 3, then 4 ranks, still counts from the first order.
A sampler of another kind (a subclass, which may deal otherwise) is resumed as saved, by its own rank.
Written by hand: torch's sampler deals a whole epoch only, and its StatefulDataLoader keeps no world size.

A partitioned cache sends each rank its records ahead of need, so it asks here for every rank's order of an
epoch: the sampler's own (``order_of``) in a fresh epoch, what each rank has left of it in a resumed one
(``resumed_orders``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

from torch.utils.data import BatchSampler, DistributedSampler

__all__ = ["Dealt", "Orders", "dealing", "dealt_again", "needs_dealing_again", "order_of", "resumed_orders"]

Orders = Callable[[int], list[int]]  # rank -> the samples that rank's loader walks in an epoch, in order


class Dealt(TypedDict):
    """An epoch's dealing: among ``num_replicas`` ranks from position ``at`` (batches each rank had handed
    out when it began) on, after ``reached`` positions of the order were reached under earlier dealings; the
    order is the one of the sampler's ``epoch`` and ``seed`` over ``records``."""

    num_replicas: int
    reached: int
    at: int
    epoch: int
    seed: int
    records: int


def _distributed(inner: Any) -> tuple[DistributedSampler, int] | None:
    """The DistributedSampler the loader's index sampler draws from and the samples in one of its items
    (1: unbatched), or None."""
    if type(inner) is BatchSampler and type(inner.sampler) is DistributedSampler:
        return inner.sampler, inner.batch_size
    if type(inner) is DistributedSampler:
        return inner, 1
    return None


def dealing(inner: Any) -> Dealt | None:
    """How a freshly drawn epoch is dealt: among the sampler's ranks from its start; None without one."""
    found = _distributed(inner)
    return None if found is None else _dealt(found[0], reached=0, at=0)


def _dealt(sampler: DistributedSampler, reached: int, at: int) -> Dealt:
    order = dict(epoch=sampler.epoch, seed=sampler.seed, records=len(sampler.dataset))
    return Dealt(num_replicas=sampler.num_replicas, reached=reached, at=at, **order)


def needs_dealing_again(inner: Any, saved: Dealt | None) -> bool:
    """Whether the saved epoch must be dealt again: its ranks were others, or an earlier resume dealt it."""
    found = _distributed(inner)
    if saved is None or found is None:
        return False
    return saved["num_replicas"] != found[0].num_replicas or saved["reached"] > 0


def dealt_again(inner: Any, saved: Dealt, start: int) -> tuple[Iterator[Any], Dealt, int]:
    """This rank's part of what the saved epoch had not reached once each rank handed out ``start`` items,
    as the loader's index sampler would yield it (batches where it batches); the new dealing; and how many
    items this rank's epoch has in all (``start`` and the new part)."""
    sampler, per_item = _distributed(inner)
    rest, now = _rest(sampler, per_item, saved, start)
    mine = _deal(rest, sampler.num_replicas, sampler.rank, sampler.drop_last)
    if type(inner) is BatchSampler:
        batches = BatchSampler(mine, inner.batch_size, inner.drop_last)
        return iter(batches), now, start + len(batches)
    return iter(mine), now, start + len(mine)


def _rest(sampler: DistributedSampler, per_item: int, saved: Dealt, start: int) -> tuple[list[int], Dealt]:
    """What the saved epoch had not reached once each rank handed out ``start`` items of ``per_item``
    samples, and the dealing of it among the sampler's ranks."""
    reached = saved["reached"] + (start - saved["at"]) * per_item * saved["num_replicas"]
    now = _dealt(sampler, reached, start)
    _check_same_order(saved, now)
    return _whole_order(sampler)[reached:], now


def order_of(sampler: DistributedSampler, rank: int) -> list[int]:
    """Rank ``rank``'s order of the sampler's current epoch, as that rank's sampler will draw it."""
    theirs = copy.copy(sampler)
    theirs.rank = rank
    return list(theirs)


def resumed_orders(inner: Any, sampler: DistributedSampler, saved: Dealt | None, start: int) -> Orders:
    """Every rank's order of the epoch its loader resumes from ``saved`` after each rank handed out ``start``
    items of the index sampler ``inner`` (which draws from ``sampler``): the rest of what the saved epoch had
    not reached, dealt again among the ranks where ``dealt_again`` deals it (a sampler of another epoch, seed
    or dataset length refused here, before anything is drawn), else the rest of each rank's own order."""
    per_item = inner.batch_size if isinstance(inner, BatchSampler) else 1
    if needs_dealing_again(inner, saved):
        rest, _ = _rest(sampler, per_item, saved, start)
        return lambda rank: _deal(rest, sampler.num_replicas, rank, sampler.drop_last)
    return lambda rank: order_of(sampler, rank)[start * per_item :]


def _check_same_order(saved: Dealt, now: Dealt) -> None:
    """ValueError where the sampler would draw another order than the saved epoch's."""
    drawn = {key: saved.get(key, now[key]) for key in ("epoch", "seed", "records")}
    if all(drawn[key] == now[key] for key in drawn):
        return
    was, has = (f"epoch {d['epoch']}, seed {d['seed']}, {d['records']} records" for d in (drawn, now))
    raise ValueError(
        f"the saved epoch is a DistributedSampler's {was}; this loader's sampler has {has}: call "
        f"set_epoch({drawn['epoch']}) on it before iterating, over the same dataset and seed"
    )


def _whole_order(sampler: DistributedSampler) -> list[int]:
    """The epoch's order of the whole dataset, drawn by torch's sampler as the only rank."""
    whole = copy.copy(sampler)
    whole.num_replicas, whole.rank = 1, 0
    whole.num_samples = whole.total_size = len(sampler.dataset)
    return list(whole)


def _deal(rest: list[int], ranks: int, rank: int, drop_last: bool) -> list[int]:
    """``rest`` dealt round-robin as ``DistributedSampler`` deals: ``rank``'s share, every rank's as long."""
    if drop_last:
        total = len(rest) // ranks * ranks
        rest = rest[:total]
    else:
        total = math.ceil(len(rest) / ranks) * ranks
        pad = total - len(rest)
        if rest and pad:
            rest = rest + (rest * math.ceil(pad / len(rest)))[:pad]
    return rest[rank:total:ranks]
