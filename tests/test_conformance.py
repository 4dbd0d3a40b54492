"""Conformance: ``loader.DataLoader`` does what ``torch.utils.data.DataLoader`` does, case by case.

Each comparison runs the same code with torch's class and ours in one test and asserts the outcomes equal
(values, exception type and message, warnings); tests of a property hold for both classes, parametrized.
"""

from __future__ import annotations

import gc
import inspect
import itertools
import json
import math
import subprocess
import sys
import typing
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import _conformance_data as cd
import numpy as np
import psutil
import pytest
import torch
import torch.utils.data as tud
from _endless_job import Endless, StatefulBatches, StatefulIndices
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.datapipes.map import SequenceWrapper

import loader

TORCH, OURS = tud.DataLoader, loader.DataLoader
CLASSES = pytest.mark.parametrize("cls", [TORCH, OURS], ids=["torch", "ours"])
WAIT = 60  # seconds: the timeout= of every multi-worker loader, so a hang fails instead of blocking


def plain(value: Any) -> Any:
    """A batch as comparable Python values, keeping the container and tensor types visible."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.tolist())
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def outcome(run) -> tuple[Any, list[tuple[type, str]]]:
    """What ``run()`` returned or raised (type and message), and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result: Any = ("returned", plain(run()))
        except Exception as exc:
            exc.__traceback__ = None  # frees a failed iterator now, which stops its workers
            result = ("raised", type(exc), str(exc))
    return result, [(w.category, str(w.message)) for w in caught]


def same(run) -> tuple[Any, list[tuple[type, str]]]:
    """``run(cls)`` with torch's class and ours: asserts the outcomes are equal and returns it."""
    theirs = outcome(lambda: run(TORCH))
    ours = outcome(lambda: run(OURS))
    assert ours == theirs
    return theirs


def returned(result: tuple[Any, list]) -> Any:
    (kind, *value), caught = result
    assert kind == "returned" and not caught, result
    return value[0]


def flat(batches: list) -> list[int]:
    """The samples of ``plain`` batches: a tensor batch is ("tensor", dtype, values), a sample is itself."""
    return [i for b in batches for i in (b[2] if isinstance(b, tuple) else [b])]


# ---------------------------------------------------------------- the class itself


@CLASSES
def test_is_a_torch_dataloader_and_generic(cls):
    alias = cls[int]
    assert typing.get_origin(alias) is cls and typing.get_args(alias) == (int,)
    dl = alias(cd.Indexed(4))
    assert isinstance(dl, TORCH) and type(dl) is cls
    assert dl.__orig_class__ == alias
    assert [b.tolist() for b in dl] == [[i] for i in range(4)]


def test_torch_signature_is_a_prefix_of_ours():
    def described(cls) -> list[tuple]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]

    theirs, ours = described(TORCH), described(OURS)
    assert ours[: len(theirs)] == theirs
    assert all(kind is inspect.Parameter.KEYWORD_ONLY for _, kind, _ in ours[len(theirs) :])


@CLASSES
def test_dataset_argument_carries_the_type_parameter(cls):
    """``DataLoader(ds)`` with ``ds: Dataset[T]`` is a ``DataLoader[T]`` to a type checker."""
    annotation = inspect.signature(cls).parameters["dataset"].annotation
    module = vars(sys.modules[cls.__module__])
    hint = eval(annotation, module) if isinstance(annotation, str) else annotation
    assert typing.get_origin(hint) is tud.Dataset and typing.get_args(hint) == cls.__parameters__


def test_attributes_are_the_same_after_init():
    def attrs(cls):
        dl = cls(cd.Indexed(10), batch_size=3, drop_last=True)
        names = ("batch_size", "drop_last", "num_workers", "timeout", "prefetch_factor", "in_order")
        return [getattr(dl, n) for n in names] + [type(dl.sampler), type(dl.batch_sampler)]

    returned(same(attrs))


def test_setting_a_frozen_attribute_fails_the_same():
    def set_batch_size(cls):
        cls(cd.Indexed(4)).batch_size = 2

    (kind, exc_type, message), _ = same(set_batch_size)
    assert (kind, exc_type) == ("raised", ValueError) and "batch_size attribute" in message


# ---------------------------------------------------------------- map-style datasets


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=4, shuffle=True),
        dict(batch_size=4, shuffle=True, drop_last=True),
        dict(batch_size=None, shuffle=True),
        dict(batch_size=3, shuffle=False, drop_last=True),
    ],
    ids=["shuffle", "shuffle-drop_last", "shuffle-no-batching", "sequential-drop_last"],
)
def test_map_style_order_and_len(kwargs):
    def epochs(cls):
        dl = cls(cd.Indexed(18), generator=torch.Generator().manual_seed(5), **kwargs)
        return len(dl), [list(dl) for _ in range(2)]

    n, (first, second) = returned(same(epochs))
    size = kwargs["batch_size"]
    rounding = math.floor if kwargs.get("drop_last") else math.ceil
    assert n == len(first) == (18 if size is None else rounding(18 / size))
    if kwargs["shuffle"]:
        assert first != second  # a new order each epoch, the same one for both classes


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda g: tud.SubsetRandomSampler([1, 3, 5, 7, 9, 11], generator=g),
        lambda g: tud.WeightedRandomSampler([1.0] * 6 + [5.0] * 6, 20, generator=g),
        lambda g: tud.RandomSampler(range(12), replacement=True, num_samples=15, generator=g),
        lambda g: [11, 0, 10, 1, 9, 2],  # any iterable with __len__
    ],
    ids=["subset", "weighted", "replacement", "list"],
)
def test_samplers(make_sampler):
    def run(cls):
        dl = cls(cd.Indexed(12), batch_size=4, sampler=make_sampler(torch.Generator().manual_seed(2)))
        return len(dl), list(dl), list(dl)

    returned(same(run))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "sampling",
    [
        lambda: {"batch_sampler": StatefulBatches(1000, seed=1)},
        lambda: {"sampler": StatefulIndices(1000, seed=1), "batch_size": 4},
        lambda: {"sampler": Endless(1), "batch_size": 4},
    ],
    ids=["stateful-batch-sampler", "stateful-sampler", "sampler"],
)
def test_endless_samplers_give_the_same_first_batches(sampling, num_workers):
    """Samplers that never end, with a state_dict() of their own or without (issue 50)."""

    def run(cls):
        timeout = WAIT if num_workers else 0
        dl = cls(cd.Indexed(1000), num_workers=num_workers, timeout=timeout, **sampling())
        return list(itertools.islice(dl, 6))

    assert len(returned(same(run))) == 6


@pytest.mark.parametrize("num_workers", [0, 2])
def test_timm_s_multi_epochs_loader(num_workers):
    """Issue 46: timm's loader over ours raised 'generator raised StopIteration' after one epoch."""

    def run(cls):
        torch.manual_seed(3)  # without workers the samples draw from torch's global generator
        generator = torch.Generator().manual_seed(7)
        kwargs = {"num_workers": num_workers, "persistent_workers": num_workers > 0, "generator": generator}
        dl = cd.multi_epochs(cls)(cd.Augmented(10), batch_size=4, shuffle=True, **kwargs)
        return [list(dl) for _ in range(3)]

    epochs = returned(same(run))
    assert [len(epoch) for epoch in epochs] == [3, 3, 3]
    orders = [[value // 1000 for value in flat(epoch)] for epoch in epochs]
    assert all(sorted(order) == list(range(10)) for order in orders) and orders[0] != orders[1]


@pytest.mark.parametrize("batch_size", [None, 4])
def test_a_sampler_swapped_after_init(batch_size):
    """Without batching the new sampler gives the order; with it, the batch sampler made from the old one."""

    def run(cls):
        dl = cls(cd.Indexed(6), batch_size=batch_size)
        dl._DataLoader__initialized = False
        dl.sampler = [5, 3, 1, 0, 2, 4]
        dl._DataLoader__initialized = True
        return [list(dl), list(dl)]

    epochs = returned(same(run))
    assert flat(epochs[1]) == ([5, 3, 1, 0, 2, 4] if batch_size is None else list(range(6)))


def test_batch_sampler_and_collate_fn():
    def run(cls):
        batches = [[0, 1, 2], [9], [4, 5]]
        plain_batches = list(cls(cd.Indexed(10), batch_sampler=batches))
        summed = list(cls(cd.Indexed(10), batch_sampler=batches, collate_fn=sum))
        tud_sampler = tud.BatchSampler(tud.SequentialSampler(range(7)), 3, drop_last=False)
        return len(cls(cd.Indexed(7), batch_sampler=tud_sampler)), plain_batches, summed

    assert returned(same(run))[2] == [3, 9, 9]


def test_default_collate_and_default_convert():
    def run(cls):
        batched = list(cls(cd.Records(5), batch_size=2))
        converted = list(cls(cd.Arrays(3), batch_size=None))
        raw = list(cls(cd.Records(2), batch_size=None))  # default_convert leaves non-arrays alone
        return batched, converted, raw

    batched, converted, _ = returned(same(run))
    assert batched[0]["name"] == ["r0", "r1"] and converted[0] == ("tensor", "torch.int64", [0, 0])


def test_map_datapipe():
    def run(cls):
        pipe = SequenceWrapper(range(10)).map(cd.double)
        return list(cls(pipe, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0)))

    returned(same(run))


def test_pin_memory_without_an_accelerator_warns_the_same():
    def run(cls):
        return list(cls(cd.Indexed(4), batch_size=2, pin_memory=True))

    (kind, _), caught = same(run)
    assert kind == "returned"
    if not torch.accelerator.is_available():
        assert caught and "'pin_memory' argument is set as true but no accelerator" in caught[0][1]


# ---------------------------------------------------------------- iterable-style datasets


@pytest.mark.parametrize(
    ("dataset", "kwargs"),
    [
        (cd.Stream(7), dict(batch_size=3)),
        (cd.Stream(7), dict(batch_size=3, drop_last=True)),
        (cd.Stream(7), dict(batch_size=None)),
        (cd.Stream(7), dict(batch_size=3, num_workers=2)),  # each worker yields everything: duplicates
        (cd.ShardedStream(11), dict(batch_size=3, num_workers=2)),
        (cd.ShardedStream(11), dict(batch_size=3, num_workers=2, drop_last=True)),
        (cd.ShardedStream(11), dict(batch_size=None, num_workers=2)),
    ],
    ids=[
        "plain",
        "drop_last",
        "no-batching",
        "workers-unsharded",
        "workers-sharded",
        "sharded-drop",
        "sharded-none",
    ],
)
@pytest.mark.multiproc
def test_iterable_dataset(dataset, kwargs):
    timeout = dict(timeout=WAIT) if kwargs.get("num_workers") else {}
    batches = returned(same(lambda cls: list(cls(dataset, **kwargs, **timeout))))
    if kwargs.get("drop_last"):  # each process drops its own last, partial batch
        assert {len(b[2]) for b in batches} == {kwargs["batch_size"]}
    else:
        copies = 2 if type(dataset) is cd.Stream and kwargs.get("num_workers") else 1
        assert Counter(flat(batches)) == Counter({i: copies for i in range(dataset.n)})


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.multiproc
def test_iterable_len_and_the_too_many_samples_warning(num_workers):
    dataset = cd.SizedStream(6, claimed=4)  # one object for both: the warning names it

    def run(cls):
        dl = cls(dataset, batch_size=None, num_workers=num_workers, timeout=WAIT if num_workers else 0)
        return len(dl), list(dl)

    (kind, (n, samples)), caught = same(run)
    assert (kind, n, samples) == ("returned", 4, list(range(6)))
    assert [c for c, _ in caught] == [UserWarning, UserWarning]  # for the 5th and the 6th sample
    assert "was reported to be 4" in caught[0][1] and "5 samples have been fetched" in caught[0][1]
    assert ("IterableDataset replica" in caught[0][1]) == bool(num_workers)


def test_iterable_len_rounds_by_batch_and_needs_dataset_len():
    def run(cls):
        sized = cd.SizedStream(10, claimed=10)
        return len(cls(sized, batch_size=3)), len(cls(sized, batch_size=3, drop_last=True))

    assert returned(same(run)) == (4, 3)
    stream = cd.Stream(3)
    (kind, exc_type, _), _ = same(lambda cls: len(cls(stream)))
    assert (kind, exc_type) == ("raised", TypeError)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.multiproc
def test_datapipe_shuffle_and_sharding(num_workers):
    def run(cls):
        pipe = IterableWrapper(range(20)).shuffle().sharding_filter()
        g = torch.Generator().manual_seed(4)
        kw = dict(timeout=WAIT) if num_workers else {}
        dl = cls(pipe, batch_size=4, shuffle=True, num_workers=num_workers, generator=g, **kw)
        return [list(dl) for _ in range(2)]

    first, second = returned(same(run))
    assert sorted(flat(first)) == sorted(flat(second)) == list(range(20))
    assert flat(first) != flat(second)


# ---------------------------------------------------------------- bad arguments


def _sampler() -> tud.Sampler:
    return tud.SequentialSampler(range(4))


BAD_ARGUMENTS = {
    "batch_size-with-batch_sampler": dict(batch_size=2, batch_sampler=[[0, 1]]),
    "shuffle-with-batch_sampler": dict(shuffle=True, batch_sampler=[[0, 1]]),
    "drop_last-with-batch_sampler": dict(drop_last=True, batch_sampler=[[0, 1]]),
    "shuffle-with-sampler": dict(shuffle=True, sampler=[0, 1]),
    "negative-num_workers": dict(num_workers=-1),
    "num_workers-not-int": dict(num_workers="2"),
    "negative-timeout": dict(timeout=-1),
    "prefetch_factor-without-workers": dict(prefetch_factor=2),
    "negative-prefetch_factor": dict(num_workers=1, prefetch_factor=-1),
    "persistent_workers-without-workers": dict(persistent_workers=True),
    "batch_size-None-with-drop_last": dict(batch_size=None, drop_last=True),
    "context-without-workers": dict(multiprocessing_context="spawn"),
    "unknown-context": dict(num_workers=1, multiprocessing_context="nope"),
    "context-of-wrong-type": dict(num_workers=1, multiprocessing_context=3),
}


@pytest.mark.parametrize("kwargs", BAD_ARGUMENTS.values(), ids=list(BAD_ARGUMENTS))
def test_bad_arguments_raise_the_same(kwargs):
    (kind, *_), caught = same(lambda cls: cls(cd.Indexed(4), **kwargs))
    assert kind == "raised" and not caught


@pytest.mark.parametrize(
    "kwargs",
    [dict(shuffle=True), dict(sampler=_sampler()), dict(batch_sampler=_sampler())],
    ids=["shuffle", "sampler", "batch_sampler"],
)
def test_iterable_dataset_rejects_sampling_arguments_the_same(kwargs):
    (kind, exc_type, message), _ = same(lambda cls: cls(cd.Stream(4), **kwargs))
    assert (kind, exc_type) == ("raised", ValueError) and "DataLoader with IterableDataset" in message


def test_too_many_workers_warns_the_same():
    workers = (torch._utils.cpu_count() or 1) + 1
    (kind, _), caught = same(lambda cls: len(cls(cd.Indexed(4), num_workers=workers)))
    assert kind == "returned" and [c for c, _ in caught] == [UserWarning]
    assert f"will create {workers} worker processes" in caught[0][1]


# ---------------------------------------------------------------- errors in workers, timeout


def _until_error(dl) -> tuple[list, str, str]:
    """Batches up to the first error, and the error's type and message."""
    got = []
    try:
        for batch in dl:
            got.append(plain(batch))
    except Exception as exc:
        exc.__traceback__ = None  # frees the iterator now: a cycle through it would wait for gc
        return got, type(exc).__name__, str(exc)
    return got, "", ""


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.multiproc
def test_error_in_getitem_reaches_the_consumer_the_same(num_workers):
    def run(cls):
        kw = dict(timeout=WAIT) if num_workers else {}
        return _until_error(cls(cd.Failing(8, bad=3), batch_size=2, num_workers=num_workers, **kw))

    got, exc_type, message = returned(same(run))
    assert got == [("tensor", "torch.int64", [0, 1])] and exc_type == "ValueError"
    assert "bad index 3" in message
    assert ("Caught ValueError in DataLoader worker process 1" in message) == bool(num_workers)


@pytest.mark.multiproc
def test_error_in_worker_init_fn_reaches_the_consumer_the_same():
    def run(cls):
        dl = cls(cd.Indexed(8), num_workers=2, worker_init_fn=cd.failing_init, timeout=WAIT)
        return _until_error(dl)

    got, exc_type, message = returned(same(run))
    assert (got, exc_type) == ([], "RuntimeError")
    assert "in DataLoader worker process 0" in message and "init failed in worker 0" in message


@pytest.mark.multiproc
def test_timeout_raises_the_same():
    def run(cls):
        slow = cd.Slow(4, delays={0: 0.5})
        return _until_error(cls(slow, num_workers=1, prefetch_factor=1, timeout=0.1))

    assert returned(same(run)) == ([], "RuntimeError", "DataLoader timed out after 0.1 seconds")


def test_timeout_without_workers_fails_the_same():
    (kind, exc_type, message), _ = same(lambda cls: iter(cls(cd.Indexed(2), timeout=1)))
    assert (kind, exc_type) == ("raised", AssertionError) and "timeout == 0" in message


# ---------------------------------------------------------------- workers: shutdown, limits, seeds


def _new_children(before: set[int]) -> list[psutil.Process]:
    return [c for c in psutil.Process().children() if c.pid not in before]


@CLASSES
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.multiproc
def test_early_exit_stops_every_worker(cls, persistent):
    """Without the cycle collector: torch's loader is freed when its last reference goes, so must ours be
    (a reference cycle left its persistent workers running until a collection happened to run)."""
    before = {c.pid for c in psutil.Process().children()}
    dl = cls(cd.Indexed(64), batch_size=2, num_workers=2, persistent_workers=persistent, timeout=WAIT)
    for k, _ in enumerate(dl):
        if k == 1:
            workers = _new_children(before)
            break
    assert len(workers) == 2
    gc.disable()
    try:
        del dl  # the loop's iterator is gone with the loop; with persistent workers the loader holds it
        _, alive = psutil.wait_procs(workers, timeout=WAIT)
    finally:
        gc.enable()
    assert not alive


@CLASSES
@pytest.mark.multiproc
def test_deleting_the_iterator_stops_its_workers(cls):
    before = {c.pid for c in psutil.Process().children()}
    it = iter(cls(cd.Indexed(64), batch_size=2, num_workers=2, timeout=WAIT))
    assert [next(it).tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    workers = _new_children(before)
    assert len(workers) == 2
    del it
    _, alive = psutil.wait_procs(workers, timeout=WAIT)
    assert not alive


@pytest.mark.slow
@pytest.mark.multiproc
def test_open_files_limit_gives_the_same_outcome():
    """Under a low RLIMIT_NOFILE with the file_descriptor strategy, both finish when batches are dropped
    and both fail with torch's hint (ulimit -n, set_sharing_strategy) when every batch is kept alive."""
    script = Path(cd.__file__)

    def run(which: str) -> dict:
        done = subprocess.run(
            [sys.executable, str(script), which, "128", "300"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=script.parent,
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    theirs, ours = run("torch"), run("ours")
    assert ours == theirs
    assert theirs == {
        "False": {"batches": 300, "error": None},
        "True": {"error": "RuntimeError", "hint": True},
    }


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.multiproc
def test_manual_seed_reproduces_three_epochs_of_random_augmentation(persistent):
    def run(cls):
        torch.manual_seed(123)
        dl = cls(
            cd.Augmented(12),
            batch_size=3,
            shuffle=True,
            num_workers=2,
            persistent_workers=persistent,
            timeout=WAIT,
        )
        return [list(dl) for _ in range(3)]

    epochs = returned(same(run))
    assert returned(outcome(lambda: run(OURS))) == epochs  # and again: it is reproducible, not just equal
    assert len({str(e) for e in epochs}) == 3
    assert all(sorted(i // 1000 for i in flat(e)) == list(range(12)) for e in epochs)


@pytest.mark.multiproc
def test_generator_sets_the_workers_base_seed():
    def run(cls, seed: int):
        g = torch.Generator().manual_seed(seed)
        stream = sorted(cls(cd.SeedStream(), batch_size=None, num_workers=2, generator=g, timeout=WAIT))
        g = torch.Generator().manual_seed(seed)
        mapped = list(cls(cd.WorkerSeed(2), batch_size=None, num_workers=2, generator=g, timeout=WAIT))
        return stream, mapped

    seven = returned(same(lambda cls: run(cls, 7)))
    eight = returned(same(lambda cls: run(cls, 8)))
    (w0, seed0), (w1, seed1) = seven[0]
    assert (w0, w1, seed1 - seed0) == (0, 1, 1)  # base seed + worker id
    assert seven[1] == [seed0, seed1] and seven != eight


@pytest.mark.multiproc
def test_in_order_false_gives_the_same_samples():
    def run(cls):
        slow = cd.Slow(16, delays={0: 0.3})
        dl = cls(slow, batch_size=2, num_workers=2, in_order=False, timeout=WAIT)
        return sorted(i for b in dl for i in b.tolist())

    assert returned(same(run)) == list(range(16))


@pytest.mark.slow
@pytest.mark.multiproc
def test_spawned_workers_load_a_module_level_dataset():
    def run(cls):
        dl = cls(cd.SpawnCheck(4), batch_size=2, num_workers=1, multiprocessing_context="spawn", timeout=WAIT)
        return list(dl)

    batches = returned(same(run))
    assert [b[0][2] for b in batches] == [[0, 1], [2, 3]]
    assert all(b[1][2] == [False, False] for b in batches)  # the worker was spawned, not forked


def test_iterator_protocol_is_the_same():
    def run(cls):
        it = iter(cls(cd.Indexed(10), batch_size=3))
        return iter(it) is it, len(it), next(it), [b.tolist() for b in it]

    assert returned(same(run)) == (True, 4, ("tensor", "torch.int64", [0, 1, 2]), [[3, 4, 5], [6, 7, 8], [9]])


@CLASSES
@pytest.mark.multiproc
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_iterator_is_an_instance_of_torchs_own_class(cls, num_workers):
    from helpers import MemorySource, first_index
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

    expected = _SingleProcessDataLoaderIter if num_workers == 0 else _MultiProcessingDataLoaderIter
    for dataset in (cd.Indexed(6), loader.SourceDataset(MemorySource(6), transform=first_index)):
        it = iter(cls(dataset, batch_size=2, num_workers=num_workers))
        assert isinstance(it, expected)
        assert len(list(it)) == 3
