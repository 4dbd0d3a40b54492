"""loader.transport.batch_ring: large batch tensors handed from forked workers through kept slots, the same
values as torch's loader gives, whatever the loop holds, with workers killed or stopped."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import loader
from loader.transport import batch_ring as _batch_ring
from loader.transport.dead_workers import forget_segments_of_failed
from loader.transport.ring_collate import MIN_TENSOR_BYTES

N, BATCH = 96, 32
IMAGE = (3, 224, 224)  # uint8: a batch of 32 is 4.8 MB, over MIN_TENSOR_BYTES


class Images(Dataset):
    """Samples as a user's dataset gives them: a dict of an image, a float array, a label."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        image = torch.from_numpy(np.random.default_rng(i).integers(0, 256, IMAGE, dtype=np.uint8))
        return {"image": image, "small": np.full(8, i, np.float32), "label": i}


def batches(make, **kwargs) -> list[dict]:
    generator = torch.Generator().manual_seed(7)
    dl = make(Images(), batch_size=BATCH, shuffle=True, num_workers=2, generator=generator, **kwargs)
    return [b for _ in range(2) for b in dl]


def assert_same(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_the_image_batch_is_big_enough_to_take_the_ring():
    assert BATCH * np.prod(IMAGE) >= MIN_TENSOR_BYTES > 8 * 4 * BATCH


@pytest.mark.multiproc
@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("pin", [False, True])  # without an accelerator torch pins nothing: the same path
def test_batches_equal_torchs_and_the_large_tensors_come_through_the_ring(persistent, pin):
    ours = batches(loader.DataLoader, persistent_workers=persistent, pin_memory=pin)
    theirs = batches(torch.utils.data.DataLoader, persistent_workers=persistent, pin_memory=pin)
    assert_same(ours, theirs)
    # torch's workers stack into shared memory; ours into a slot, which the main process's tensor views
    assert all(b["image"].is_shared() for b in theirs) and not any(b["image"].is_shared() for b in ours)
    # the small ones come by value: none of a batch's tensors took torch's path, which makes a segment
    assert all(b["small"].is_shared() and b["label"].is_shared() for b in theirs)
    assert not any(t.is_shared() for b in ours for t in b.values())


@pytest.mark.multiproc
def test_batches_the_loop_keeps_hold_their_values_while_later_ones_arrive():
    """Three epochs held whole: more batches than a worker has slots, so later ones take torch's path, and
    none is written over."""

    def held(make) -> list[dict]:
        generator = torch.Generator().manual_seed(7)
        dl = make(Images(), batch_size=BATCH, num_workers=2, generator=generator, shuffle=True,
                  persistent_workers=True)  # fmt: skip
        return [b for _ in range(3) for b in dl]

    ours = held(loader.DataLoader)
    assert_same(ours, held(torch.utils.data.DataLoader))
    through_ring = [not b["image"].is_shared() for b in ours]
    assert any(through_ring) and not all(through_ring)


@pytest.mark.multiproc
def test_a_slot_is_let_go_once_no_tensor_views_it():
    dl = loader.DataLoader(Images(), batch_size=BATCH, num_workers=2, persistent_workers=True)
    list(dl)
    gc.collect()
    ring = dl._iterator._batch_ring
    assert isinstance(ring, _batch_ring.BatchRing) and ring.number in _batch_ring._rings
    assert int(ring._flags.sum()) == 0 and not ring._held  # every batch dropped: every slot free
    batch = next(iter(dl))
    view = batch["image"][0]  # a view of the slot keeps it
    slot = (view.data_ptr() - ring._base - ring._head) // _batch_ring.SLOT_BYTES
    del batch
    gc.collect()
    assert ring._held[slot] == 1 and ring._flags[slot] == 1
    del view
    gc.collect()
    assert slot not in ring._held  # (another slot may hold a batch that came early)


@pytest.mark.multiproc
def test_spawned_workers_and_a_users_collate_take_torchs_path():
    spawned = batches(loader.DataLoader, multiprocessing_context="spawn")
    assert_same(spawned, batches(torch.utils.data.DataLoader, multiprocessing_context="spawn"))
    assert all(b["image"].is_shared() for b in spawned)

    def own(samples):
        return torch.utils.data.default_collate(samples)

    mine = batches(loader.DataLoader, collate_fn=own)
    assert_same(mine, batches(torch.utils.data.DataLoader, collate_fn=own))
    assert all(b["image"].is_shared() for b in mine)


KILLED = """
import os, signal, sys, time, torch
sys.path.insert(0, {tests!r})
import loader
from test_batch_ring import Images
dl = loader.DataLoader(Images(), batch_size=32, num_workers=2)
it = iter(dl)
first = next(it)
expected = first["image"].clone()
start = time.monotonic()
errors = []
# what torch's path leaves of a worker killed between a segment's creation and its unlink, for each worker
planted = ["/dev/shm/torch_%d_%d_0" % (w.pid, os.getpid()) for w in it._workers]
for name in planted:
    os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
try:
    try:
        os.kill(it._workers[1].pid, signal.SIGKILL)
        list(it)
    except RuntimeError as exc:
        errors.append(exc)
    finally:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # said once: no later exit may raise it again
except RuntimeError as exc:  # torch's SIGCHLD handler, run late: after the first error, before the reset
    errors.append(exc)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
told = ["killed by signal" in str(e) or "exited unexpectedly" in str(e) for e in errors]
left = [os.path.exists(name) for name in planted]
for name in planted:
    if os.path.exists(name):
        os.unlink(name)
print("raised", bool(told) and all(told), flush=True)
print("seconds", time.monotonic() - start < 60, "whole", torch.equal(first["image"], expected))
print("left", *left)
"""


@pytest.mark.multiproc
def test_a_killed_worker_is_reported_as_torchs_is_and_what_it_left_in_dev_shm_removed():
    """In its own process: torch's SIGCHLD handler raises wherever the main process is when a worker dies.
    The name torch's path leaves of a worker killed while making a segment is gone with it; the live worker's
    is kept."""
    script = KILLED.format(tests=os.path.dirname(__file__))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == [
        *("raised", "True", "seconds", "True", "whole", "True"),
        *("left", "True", "False"),
    ], done.stderr[-2000:]


BROKEN = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import loader
from test_batch_ring import Images
it = iter(loader.DataLoader(Images(), batch_size=32, num_workers=2))
next(it)
pid = it._workers[1].pid


class Breaking:  # the queue as a worker killed while its batch's descriptor is taken breaks it
    def get(self, timeout=None):
        os.kill(pid, signal.SIGKILL)
        raise EOFError


it._data_queue = Breaking()
try:
    it._try_get_data()
except RuntimeError as exc:
    print("raised", str(pid) in str(exc) and ("exited unexpectedly" in str(exc) or "killed" in str(exc)))
finally:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
"""


@pytest.mark.multiproc
def test_a_connection_broken_by_a_dying_worker_names_the_worker():
    """The connection breaks before the dying worker can be reaped: torch's check finds it alive still and
    raises the bare EOFError, ours waits for it and names it."""
    script = BROKEN.format(tests=os.path.dirname(__file__))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["raised", "True"], done.stderr[-2000:]


@pytest.mark.multiproc
def test_a_stopped_worker_delays_the_epoch_and_loses_nothing():
    generator = torch.Generator().manual_seed(7)
    dl = loader.DataLoader(Images(), batch_size=BATCH, num_workers=2, persistent_workers=True,
                           shuffle=True, generator=generator)  # fmt: skip
    expected = [b for b in dl]
    it = iter(dl)
    worker = dl._iterator._workers[0].pid
    os.kill(worker, signal.SIGSTOP)
    threading.Timer(2.0, os.kill, (worker, signal.SIGCONT)).start()
    got = list(it)
    assert_same(got, batches_like(expected, dl))


def batches_like(expected: list[dict], dl) -> list[dict]:
    """The order of the epoch after ``expected``'s, from torch's loader with the same generator state."""
    generator = torch.Generator().manual_seed(7)
    theirs = torch.utils.data.DataLoader(Images(), batch_size=BATCH, num_workers=2, persistent_workers=True,
                                         shuffle=True, generator=generator)  # fmt: skip
    first = list(theirs)
    assert_same(expected, first)
    return list(theirs)


def slot_of(ring: _batch_ring.BatchRing, tensor: torch.Tensor) -> int:
    return (tensor.data_ptr() - ring._base - ring._head) // _batch_ring.SLOT_BYTES


@pytest.mark.multiproc
def test_a_forked_child_dropping_its_copy_of_a_batch_frees_no_slot():
    dl = loader.DataLoader(Images(), batch_size=BATCH, num_workers=2, persistent_workers=True)
    batch = next(iter(dl))
    ring = dl._iterator._batch_ring
    slot = slot_of(ring, batch["image"])
    pid = os.fork()
    if pid == 0:  # the child's copy of the batch dies here; the parent still holds the slot
        del batch
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    assert ring._held[slot] == 1 and ring._flags[slot] == 1
    del batch
    gc.collect()
    assert slot not in ring._held and ring._flags[slot] == 0


def test_the_flags_of_many_slots_lie_before_the_first_slots_data():
    ring = _batch_ring.BatchRing(300, 4)  # 1,200 flags: more than one page
    ring.view(0, 0, 4096)[:] = 255
    assert ring._head >= 4 * 1200 and int(ring._flags.sum()) == 0
    ring.close()


class Tagged(torch.Tensor):
    pass


class TaggedImages(Images):
    def __getitem__(self, i: int) -> dict:
        sample = super().__getitem__(i)
        sample["image"] = sample["image"].as_subclass(Tagged)
        return sample


@pytest.mark.multiproc
def test_a_tensor_subclass_and_a_users_tensor_collate_take_torchs_path(monkeypatch):
    def tagged(make) -> list[dict]:
        return list(make(TaggedImages(), batch_size=BATCH, num_workers=2))

    ours, theirs = tagged(loader.DataLoader), tagged(torch.utils.data.DataLoader)
    assert all(type(b["image"]) is Tagged for b in ours + theirs)
    assert_same(ours, theirs)

    def plus_one(batch, *, collate_fn_map=None):  # torch documents changing its map in place
        return torch.stack(batch) + 1

    monkeypatch.setitem(torch.utils.data._utils.collate.default_collate_fn_map, torch.Tensor, plus_one)
    ours, theirs = batches(loader.DataLoader), batches(torch.utils.data.DataLoader)
    assert_same(ours, theirs)
    assert torch.equal(theirs[0]["image"][0], Images()[int(theirs[0]["label"][0])]["image"] + 1)


class Mixed(Dataset):
    """Samples whose dtypes differ (float32, then float64) or that need a gradient, as a careless dataset
    gives them."""

    def __init__(self, grad: bool = False) -> None:
        self.grad = grad

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full(
            (4,), float(i), dtype=torch.float64 if i % 2 else torch.float32, requires_grad=self.grad
        )


def outcome(make, dataset) -> list | str:
    try:
        return [b for b in make(dataset, batch_size=4, num_workers=2, timeout=60)]
    except RuntimeError as exc:
        return type(exc).__name__ + ": " + str(exc).splitlines()[-1]


@pytest.mark.multiproc
def test_a_small_batch_of_mixed_dtypes_takes_the_first_sample_s_as_torch_s_does():
    ours, theirs = outcome(loader.DataLoader, Mixed()), outcome(torch.utils.data.DataLoader, Mixed())
    if isinstance(theirs, str):
        assert ours == theirs
    else:
        assert [(b.dtype, b.tolist()) for b in ours] == [(b.dtype, b.tolist()) for b in theirs]


@pytest.mark.multiproc
def test_a_sample_that_needs_a_gradient_fails_in_the_loop_as_with_torch_and_nothing_hangs():
    ours, theirs = (
        outcome(loader.DataLoader, Mixed(grad=True)),
        outcome(torch.utils.data.DataLoader, Mixed(grad=True)),
    )
    assert isinstance(theirs, str) and ours == theirs


class DeadWorker:
    def __init__(self, pid: int) -> None:
        self.pid, self.exitcode = pid, -9


def test_a_dead_worker_s_names_are_removed_once_never_again_under_a_reused_pid():
    """Torch shuts workers down more than once; by the second time the pid may be another process's."""
    worker = DeadWorker(2**22 + os.getpid() % 1000)  # above this machine's pid_max: no live process's
    name = f"/dev/shm/torch_{worker.pid}_{os.getpid()}_0"
    try:
        os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        forget_segments_of_failed([worker])
        assert not os.path.exists(name)
        os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # the pid's next process
        forget_segments_of_failed([worker])
        assert os.path.exists(name)
    finally:
        if os.path.exists(name):
            os.unlink(name)
