"""What forking workers costs the job in memory (``loader.system.forkgrowth``), measured on real children."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
from typing import ClassVar

import pytest
import torch

from loader import DataLoader
from loader.dataloader import iterators as _iterators
from loader.system import forkgrowth

MIB = 1 << 20
PAGE = 4096
pytestmark = pytest.mark.multiproc

_shared = bytearray()  # the parent's memory, inherited by forked children


@pytest.fixture(autouse=True)
def no_earlier_workers_ending(monkeypatch):
    """Earlier tests' loaders collected now, their workers shut down: children ending during a test would
    take their memory out of the family's. Every fork of a test is measured (no budget)."""
    gc.collect()
    monkeypatch.setattr(forkgrowth, "BUDGET", float("inf"))
    monkeypatch.setattr(forkgrowth, "_next_reading", 0.0)


def _allocate_then_wait(nbytes: int, ready, done) -> None:
    gc.disable()  # a full collection would copy every page of the test process's heap: not this test's growth
    held = bytearray(nbytes)
    held[::PAGE] = b"\x01" * len(range(0, nbytes, PAGE))  # every page touched
    ready.set()
    done.wait(30)


def _copy_then_wait(ready, done) -> None:
    gc.disable()
    _shared[::PAGE] = b"\x02" * len(range(0, len(_shared), PAGE))  # each page copied on write
    ready.set()
    done.wait(30)


def _run_children(target, args: tuple, count: int) -> tuple[list, list]:
    """``count`` forked children running ``target``, each with an event of its own to end on (a child
    killed in a shared event's wait would leave its ``set`` waiting for it for ever)."""
    context = multiprocessing.get_context("fork")
    ready, done = [context.Event() for _ in range(count)], [context.Event() for _ in range(count)]
    children = [context.Process(target=target, args=(*args, ready[i], done[i])) for i in range(count)]
    for child in children:
        child.start()
    for event in ready:
        assert event.wait(30), "a child did not start"
    return children, done


def _stop(children: list, done: list) -> None:
    for event in done:
        event.set()
    for child in children:
        child.join(30)
        assert child.exitcode == 0


def test_nothing_is_expected_before_this_process_forked_workers():
    assert forkgrowth.measure_growth() == 0 and forkgrowth.growth_for(2) == 0


def test_workers_allocations_are_the_growth_expected_of_the_next_workers_per_worker():
    assert forkgrowth.growth_for(2) == 0  # notes the fork about to happen
    children, done = _run_children(_allocate_then_wait, (48 * MIB,), 2)
    try:
        per_worker = forkgrowth.measure_growth()
        assert 48 * MIB <= per_worker < 64 * MIB
        assert forkgrowth.growth_for(3) >= 3 * per_worker  # measured again: the most stands
    finally:
        _stop(children, done)


def test_pages_a_worker_copies_on_write_count_and_the_pages_it_shares_do_not():
    global _shared
    _shared = bytearray(b"\x00" * (64 * MIB))
    try:
        forkgrowth.growth_for(1)
        children, done = _run_children(_copy_then_wait, (), 1)
        try:
            assert 64 * MIB <= forkgrowth.measure_growth() < 80 * MIB
        finally:
            _stop(children, done)
        forkgrowth.growth_for(1)
        children, done = _run_children(_allocate_then_wait, (0,), 1)  # shares all, copies nothing
        try:
            assert forkgrowth.family_anon() - forkgrowth._last_fork[0] < 16 * MIB
        finally:
            _stop(children, done)
    finally:
        _shared = bytearray()


def test_the_most_measured_stands_once_the_workers_are_gone():
    forkgrowth.growth_for(1)
    children, done = _run_children(_allocate_then_wait, (32 * MIB,), 1)
    measured = forkgrowth.measure_growth()
    _stop(children, done)
    assert measured >= 32 * MIB and forkgrowth.measure_growth() == measured


class _Hoarding(torch.utils.data.Dataset):
    """Each worker keeps 32 MiB once it loads a record."""

    kept: ClassVar[list[bytearray]] = []

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        if not self.kept:
            self.kept.append(bytearray(b"\x01" * (32 * MIB)))
        return index


def test_a_loader_notes_what_its_workers_took_before_it_shuts_them_down():
    dl = DataLoader(_Hoarding(), batch_size=2, num_workers=1)  # workers not persistent: gone after the epoch
    batches = iter(dl)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3]]
    assert not any(worker.is_alive() for worker in batches._workers)  # noted before they went
    assert forkgrowth.measure_growth() >= 32 * MIB


def test_workers_shut_down_as_the_interpreter_exits_measure_nothing_and_raise_nothing(monkeypatch):
    """At exit a module's globals are None when a loader's iterator is collected: it still shuts down."""
    dl = DataLoader(_Hoarding(), batch_size=2, num_workers=1, persistent_workers=True)
    batches = iter(dl)
    assert next(batches).tolist() == [0, 1]
    monkeypatch.setattr(_iterators, "_utils", None)
    monkeypatch.setattr(_iterators, "measure_growth", lambda: pytest.fail("measured at exit"))
    batches._shutdown_workers()
    assert not any(worker.is_alive() for worker in batches._workers)


def test_a_killed_and_a_stopped_worker_leave_the_measure_whole_and_nothing_waits():
    forkgrowth.growth_for(2)
    children, done = _run_children(_allocate_then_wait, (32 * MIB,), 2)
    stopped, killed = children
    os.kill(stopped.pid, signal.SIGSTOP)
    os.kill(killed.pid, signal.SIGKILL)
    killed.join(30)
    try:
        assert 16 * MIB <= forkgrowth.measure_growth() < 32 * MIB  # the stopped one's 32 MiB over two workers
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
        done[0].set()
        stopped.join(30)
    assert (stopped.exitcode, killed.exitcode) == (0, -signal.SIGKILL)


def test_forks_are_measured_within_their_budget_of_the_process_s_time(monkeypatch):
    readings = []
    monkeypatch.setattr(forkgrowth, "family_anon", lambda: readings.append(1) or 100 * MIB)
    monkeypatch.setattr(forkgrowth, "BUDGET", 0.01)
    monkeypatch.setattr(forkgrowth, "_most_per_worker", 8 * MIB)
    clock = iter([10.0, 10.0, 10.02, 10.1, 10.12, 10.5, 13.99, 14.0, 14.0, 14.02, 14.1, 14.12])  # 20 ms
    monkeypatch.setattr(forkgrowth.time, "monotonic", lambda: next(clock))
    assert forkgrowth.growth_for(2) == 16 * MIB and len(readings) == 1  # due: read, then 2 s not due
    assert forkgrowth.measure_growth() == 8 * MIB and len(readings) == 2  # its shutdown: read, 2 s more
    assert forkgrowth.growth_for(2) == 16 * MIB and len(readings) == 2  # 10.5 s: not measured
    assert forkgrowth._last_fork is None and forkgrowth.measure_growth() == 8 * MIB and len(readings) == 2
    assert forkgrowth.growth_for(1) == 8 * MIB and len(readings) == 2  # 13.99 s: not yet
    assert forkgrowth.growth_for(1) == 8 * MIB and len(readings) == 3  # 14 s: due again
    assert forkgrowth.growth_for(1) == 8 * MIB and len(readings) == 4  # 14.1 s: the last fork's still open


def test_a_fork_while_a_measured_fork_s_workers_run_is_measured_whatever_the_budget(monkeypatch):
    """A persistent loader's workers forked, then an evaluation loader's soon after: the second reading is
    the first fork's growth, not lost to the budget."""
    anon = iter([100 * MIB, 140 * MIB, 150 * MIB])
    monkeypatch.setattr(forkgrowth, "family_anon", lambda: next(anon))
    monkeypatch.setattr(forkgrowth, "BUDGET", 1e-9)  # no reading would ever be due again
    assert forkgrowth.growth_for(2) == 0  # the process's first fork: read
    assert forkgrowth.growth_for(1) == 20 * MIB  # read though not due: 40 MiB over the 2 workers before
    assert forkgrowth.measure_growth() == 20 * MIB and forkgrowth._last_fork is None
