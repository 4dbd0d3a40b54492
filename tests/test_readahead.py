"""Read-ahead turns itself on where fetches are slow against decode, off where records are in memory."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import MemorySource, first_index

from loader import DataLoader, SourceDataset
from loader.fetching.readahead import (
    COPY_BPS,
    HOLD_OFF,
    MIN_FETCH_S,
    PROBE_EVERY,
    SLOWER_THAN_COPY,
    ReadAhead,
)


class SlowReads(MemorySource):
    """Records on 'storage': each read waits ``delay`` seconds, as a disk or network read does."""

    def __init__(self, n: int, delay: float) -> None:
        super().__init__(n)
        self.delay = delay

    def read(self, index: int) -> bytes:
        if self.delay:
            time.sleep(self.delay)
        return super().read(index)


def slow_decode(raw: bytes) -> int:
    time.sleep(0.002)
    return first_index(raw)


def switch_of(dl: DataLoader) -> ReadAhead:
    return dl.dataset._readahead


def test_records_in_memory_are_never_read_ahead():
    dl = DataLoader(SourceDataset(MemorySource(64), transform=slow_decode), batch_size=8)
    assert [i for b, _ in dl for i in b.tolist()] == list(range(64))
    assert not switch_of(dl).active and switch_of(dl)._pool is None  # no thread was ever started


def test_slow_reads_turn_it_on_after_one_batch_and_keep_the_order():
    source = SlowReads(64, delay=0.003)
    dl = DataLoader(SourceDataset(source, transform=first_index), batch_size=8, shuffle=True)
    order, seen = [], []
    for batch, _ in dl:
        seen.append(switch_of(dl).active)
        order.extend(batch.tolist())
    assert seen[0] is True and all(seen)  # measured on the first batch, on from the second
    assert sorted(order) == list(range(64)) and switch_of(dl)._pool is not None


def test_it_turns_off_when_reads_become_fast():
    source = SlowReads(8 * (PROBE_EVERY + 2), delay=0.003)
    dl = DataLoader(SourceDataset(source, transform=first_index), batch_size=8)
    it = iter(dl)
    next(it)
    assert switch_of(dl).active
    dl.dataset.source.delay = 0  # its records are now in memory
    states = [switch_of(dl).active for _ in it]
    assert not any(states)  # the next batch read ahead found its misses as fast as memory copies: off


@pytest.mark.parametrize(
    ("fetch", "decode", "size", "on"),
    [
        (2 * MIN_FETCH_S, 0.0, 0, True),
        (MIN_FETCH_S / 2, 0.0, 0, False),
        (1e-3, 1e-3 / 0.09, 0, False),
        (1e-3, 5e-3, 0, True),
        (60e-6, 0.0, 112 << 10, False),  # 112 KB in 60 us: a memory copy, however slow the decode
        (600e-6, 0.0, 112 << 10, True),  # the same record at 200 MB/s: storage
        ((MIN_FETCH_S + 100e3 / COPY_BPS) * SLOWER_THAN_COPY * 1.01, 0.0, 100_000, True),
        ((MIN_FETCH_S + 100e3 / COPY_BPS) * SLOWER_THAN_COPY * 0.99, 0.0, 100_000, False),  # a preempted copy
    ],
)
def test_the_switch_weighs_fetch_against_a_copy_and_decode(fetch, decode, size, on):
    switch = ReadAhead(2)
    switch.observe(fetch * 10, decode * 10, 10, size * 10)
    assert switch.active is on


def test_a_batch_wholly_from_the_cache_turns_it_off(shm_dir):
    source = SlowReads(64, delay=0.003)
    data = SourceDataset(source, transform=first_index)
    dl = DataLoader(data, batch_size=8, cache_bytes=1 << 20, cache_dir=shm_dir)
    first = [switch_of(dl).active for _ in dl]  # epoch 1 reads storage and fills the cache
    second = [switch_of(dl).active for _ in dl]  # epoch 2: every record is a hit
    assert first[-1] is True
    assert second[0] is False and not any(second)


@pytest.mark.parametrize(
    ("misses", "seconds", "size", "stays_on"),
    [
        (0, 0.0, 0, False),  # all from our cache
        (32, 32 * 60e-6, 32 * (112 << 10), False),  # misses at memory speed: the page cache held them
        (32, 32 * 250e-6, 32 * (112 << 10), False),  # the same on threads that wait for the GIL
        (32, 32 * 600e-6, 32 * (112 << 10), True),  # misses at 200 MB/s: storage
    ],
)
def test_a_batch_read_ahead_keeps_it_on_only_for_misses_slower_than_a_copy(misses, seconds, size, stays_on):
    switch = ReadAhead(2)
    switch.active = True
    switch.read_ahead(32, seconds, misses, seconds, size)
    assert switch.active is stays_on


class CappedReads(SlowReads):
    """Storage capped in bytes per second: one read at a time, however many threads ask."""

    def __init__(self, n: int, delay: float) -> None:
        super().__init__(n, delay)
        self._device = threading.Lock()

    def read(self, index: int) -> bytes:
        with self._device:
            return super().read(index)


def test_reads_that_threads_cannot_speed_up_turn_it_off_for_a_while():
    source = CappedReads(8 * (PROBE_EVERY + 8), delay=0.002)
    dl = DataLoader(SourceDataset(source, transform=first_index), batch_size=8)
    states = [switch_of(dl).active for _ in dl]
    assert states[0] is True  # slow fetches: tried
    off = states.index(False)
    assert off == PROBE_EVERY - 1  # the first one-by-one batch found the threads bought nothing
    assert not any(states[off:])  # and it stays off (HOLD_OFF batches), though each fetch is slow


def test_reads_that_threads_speed_up_keep_it_on_past_a_probe():
    source = SlowReads(8 * (PROBE_EVERY + 8), delay=0.002)
    dl = DataLoader(SourceDataset(source, transform=first_index), batch_size=8)
    assert all(switch_of(dl).active for _ in dl)


@pytest.mark.parametrize(("ahead", "one_by_one", "stays_on"), [(0.5, 1.0, True), (0.95, 1.0, False)])
def test_a_probe_keeps_it_on_only_where_the_batches_read_ahead_were_faster(ahead, one_by_one, stays_on):
    switch = ReadAhead(2)
    switch.active = True
    for _ in range(3):
        switch.read_ahead(10, ahead * 10e-3, misses=10, miss_seconds=10e-3, miss_bytes=0)
    switch.observe(10e-3, 0.0, 10, 0, one_by_one * 10e-3)  # fetches slow enough to keep it on by themselves
    assert switch.active is stays_on
    if not stays_on:
        for _ in range(HOLD_OFF - 1):
            assert not switch.wanted()
            switch.observe(10e-3, 0.0, 10, 0, 10e-3)
            assert not switch.active
        switch.wanted()
        switch.observe(10e-3, 0.0, 10, 0, 10e-3)
        assert switch.active  # held off long enough: tried again


@pytest.mark.parametrize(
    ("threads", "fetch", "decode", "in_flight"),
    [
        (32, 20e-3, 1e-3, 21),  # object storage 20 ms away: 20 fetches behind each one decoding, and one
        (16, 20e-3, 1e-3, 16),  # at most the threads given
        (16, 0.5e-3, 1e-3, 2),  # a local disk: one fetching while one decodes
        (16, 3e-3, 0.0, 16),  # nothing to decode: as many as allowed
        (1, 3e-3, 1e-3, 1),
    ],
)
def test_the_fetches_in_flight_hide_one_fetch_behind_decodes(threads, fetch, decode, in_flight):
    switch = ReadAhead(threads)
    switch.observe(fetch * 10, decode * 10, 10)
    assert switch.in_flight == in_flight


def test_no_more_fetches_run_at_once_than_in_flight_and_the_order_holds():
    switch = ReadAhead(8)
    switch.in_flight = 3
    running, most, lock = 0, 0, threading.Lock()

    def fetch(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.005)
        with lock:
            running -= 1
        return i

    got = [result() for result in switch.fetched(fetch, list(range(20)))]
    assert got == list(range(20))
    assert 2 <= most <= 3


def test_object_storage_latency_opens_the_window_in_a_loader():
    """Reads 20 ms away and a 1 ms decode: the worker keeps many more than two fetches in flight."""
    source = SlowReads(64, delay=0.02)
    decode = lambda raw: (time.sleep(0.001), first_index(raw))[1]  # noqa: E731
    dl = DataLoader(SourceDataset(source, transform=decode), batch_size=16, readahead=32)
    assert sorted(i for b, _ in dl for i in b.tolist()) == list(range(64))
    assert switch_of(dl).active and switch_of(dl).in_flight >= 8  # ~21; sleeps only stretch on a busy machine


def test_a_batch_sampler_that_yields_arrays_is_read_ahead_as_lists_are():
    import numpy as np

    batches = [np.arange(i, i + 8) for i in range(0, 64, 8)]
    dl = DataLoader(SourceDataset(SlowReads(64, delay=0.003), transform=first_index), batch_sampler=batches)
    assert [b.tolist() for b, _ in dl] == [b.tolist() for b in batches]
    assert switch_of(dl).active  # read ahead after the first batch's records measured it
