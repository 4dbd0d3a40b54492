"""Coordinated prep within one process: the staged batch format, options, errors, drop-in order, the area's
trust and its cleanup. (Several jobs at once: test_coordinated_jobs.py.)"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import loader
from loader.coordinated._batchfile import BadBatchFile, read_batch, write_batch
from loader.system.private import UntrustedCacheError
from tests._coordinated_job import Indexed
from tests.helpers import make_jpeg_folder

N = 40  # 5 batches of 8


def staged(tmp_path: Path, batch) -> Path:
    path = tmp_path / "b-0"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        write_batch(fd, batch)
    finally:
        os.close(fd)
    return path


def read_back(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_batch(fd, str(path))
    finally:
        os.close(fd)


def test_a_staged_batch_comes_back_whole_in_its_structure(tmp_path):
    batch = {
        "images": torch.randint(0, 255, (4, 3, 5, 7), dtype=torch.uint8),
        "half": torch.randn(3, 2).to(torch.bfloat16),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "strided": torch.arange(12).reshape(3, 4).t(),
        "meta": [("a", 1, 2.0, None, True)],
    }
    back = read_back(staged(tmp_path, batch))
    assert back.keys() == batch.keys() and back["meta"] == [("a", 1, 2.0, None, True)]
    for key in ("images", "half", "scalar", "empty", "strided"):
        assert back[key].dtype == batch[key].dtype and torch.equal(back[key], batch[key])
    back["images"] += 1  # writable, as a collated batch is: a private copy-on-write view
    assert torch.equal(read_back(tmp_path / "b-0")["images"], batch["images"])


@pytest.mark.parametrize("damage", ["flip a pixel", "truncate", "flip the header"])
def test_a_damaged_staged_batch_is_refused(tmp_path, damage):
    path = staged(tmp_path, (torch.arange(1000, dtype=torch.int64), torch.ones(3)))
    raw = bytearray(path.read_bytes())
    if damage == "flip a pixel":
        raw[-100] ^= 1
    elif damage == "truncate":
        raw = raw[:-64]
    else:
        raw[20] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(BadBatchFile, match="b-0"):
        read_back(path)


def test_a_batch_holding_what_cannot_be_staged_is_named(tmp_path):
    with pytest.raises(TypeError, match="set"):
        staged(tmp_path, (torch.ones(2), {1, 2}))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(staged_batches=0), "staged_batches"),
        (dict(min_members=True), "min_members"),
        (dict(patience=-1), "patience"),
        (dict(on_lag="drop"), "on_lag"),
    ],
)
def test_bad_coordination_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        loader.Coordination(**options)


@pytest.mark.parametrize("value", ["", 3, object()])
def test_a_bad_coordinate_value_is_refused(value):
    with pytest.raises(ValueError, match="coordinate must be"):
        loader.DataLoader(Indexed(N), batch_size=8, coordinate=value)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(4))


@pytest.mark.parametrize(
    ("dataset", "kwargs", "message"),
    [
        (Stream(), dict(coordinate="g"), "map-style"),
        (Indexed(N), dict(coordinate="g", batch_size=None), "batch_size"),
        (Indexed(N), dict(coordinate=True), "Indexed"),
    ],
)
def test_what_cannot_be_shared_is_refused_at_construction(dataset, kwargs, message):
    with pytest.raises(ValueError, match=message):
        loader.DataLoader(dataset, **{"batch_size": 8, **kwargs})


def coordinated(shm_dir: Path, **kwargs) -> loader.DataLoader:
    options = loader.Coordination(group="solo", staging_dir=str(shm_dir))
    return loader.DataLoader(Indexed(N), batch_size=8, shuffle=True, coordinate=options, **kwargs)


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_a_job_alone_gets_what_torch_gives_with_the_same_generator(shm_dir, workers, persistent):
    kwargs = dict(
        num_workers=workers, persistent_workers=persistent, generator=torch.Generator().manual_seed(5)
    )
    ours = coordinated(shm_dir, **kwargs)
    kwargs["generator"] = torch.Generator().manual_seed(5)
    theirs = torch.utils.data.DataLoader(Indexed(N), batch_size=8, shuffle=True, **kwargs)
    for _ in range(3):
        mine, torchs = list(ours), list(theirs)
        assert len(mine) == len(torchs) == 5
        assert all(
            torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(mine, torchs, strict=True)
        )
    stats = ours.stats().coordination
    assert (stats.batches_prepared, stats.batches_consumed, stats.prep_cpu_saved_seconds) == (15, 15, 0.0)
    area = ours._coordinated.area.path
    assert area.is_dir() and oct(area.stat().st_mode & 0o777) == "0o700"
    del ours
    gc.collect()
    assert not area.exists() and not list(shm_dir.iterdir())


def test_a_loop_that_breaks_gets_a_whole_next_epoch(shm_dir):
    dl = coordinated(shm_dir)
    for k, _ in enumerate(dl):
        if k == 1:
            break
    assert sorted(i for _, idx in dl for i in idx.tolist()) == list(range(N))
    with pytest.raises(TypeError, match="coordinate"):
        dl.state_dict()


@pytest.mark.multiproc
@pytest.mark.parametrize("persistent", [False, True])
def test_with_workers_a_loop_that_breaks_gets_a_whole_next_epoch(shm_dir, persistent):
    dl = coordinated(shm_dir, num_workers=2, persistent_workers=persistent)
    for k, _ in enumerate(dl):
        if k == 1:
            break
    assert sorted(i for _, idx in dl for i in idx.tolist()) == list(range(N))
    del dl
    gc.collect()
    assert not list(shm_dir.iterdir())


@pytest.mark.multiproc
def test_a_loader_dropped_is_freed_at_once_and_its_persistent_prep_workers_stop_with_it(shm_dir):
    """No reference cycle holds a coordinated loader: dropped, it goes at once, and its prep workers are told
    to stop while their queues still run (left to the cyclic collector, the queues could close first and
    torch then waited 5 s for each worker)."""
    dl = coordinated(shm_dir, num_workers=2, persistent_workers=True)
    assert sorted(i for _, idx in dl for i in idx.tolist()) == list(range(N))
    workers = list(dl._coordinated._prep_loader._iterator._workers)
    gone = weakref.ref(dl)
    gc.disable()
    try:
        del dl
        assert gone() is None and not any(w.is_alive() for w in workers)
        assert [w.exitcode for w in workers] == [0, 0]  # stopped when told, not killed after a timeout
    finally:
        gc.enable()
    assert not list(shm_dir.iterdir())


def test_our_own_staging_area_open_to_others_is_refused_by_name(shm_dir):
    dl = coordinated(shm_dir)
    area = dl._coordinated.area.path
    del dl
    gc.collect()
    area.mkdir(mode=0o700)
    os.chmod(area, 0o777)
    with pytest.raises(UntrustedCacheError, match=rf"{area} .*mode 0777"):
        coordinated(shm_dir)


def plant(area: Path, how: str, target: Path) -> None:
    """Another user (nobody) takes the area's name first: a folder of theirs, or their link to elsewhere."""
    if how == "a folder":
        area.mkdir(mode=0o700)
        os.chown(area, 65534, 65534)
    else:
        area.symlink_to(target)
        os.lchown(area, 65534, 65534)


@pytest.mark.skipif(os.geteuid() != 0, reason="planting as another user needs root")
@pytest.mark.parametrize("how", ["a folder", "a link"])
def test_a_staging_area_another_user_planted_is_passed_over_and_said_once(shm_dir, tmp_path, how):
    os.chmod(shm_dir, 0o1777)  # as /dev/shm is
    dl = coordinated(shm_dir)
    area = dl._coordinated.area.path
    del dl
    gc.collect()
    plant(area, how, tmp_path)
    with pytest.warns(
        RuntimeWarning, match=rf"{area} was made by another user .* set Coordination\(staging_dir"
    ):
        dl = coordinated(shm_dir)
    assert dl._coordinated.area.path == area.with_name(area.name + "-1")
    assert sorted(i for _, idx in dl for i in idx.tolist()) == list(range(N))
    assert not list(tmp_path.iterdir())  # the link was not followed


def test_different_data_batching_or_transform_never_share(tmp_path, shm_dir):
    root = make_jpeg_folder(tmp_path / "images")
    options = loader.Coordination(staging_dir=str(shm_dir))

    def area(transform="train", batch_size=8, coordinate=options) -> Path:
        dataset = loader.ImageFolder(str(root), transform=transform)
        return loader.DataLoader(dataset, batch_size=batch_size, coordinate=coordinate)._coordinated.area.path

    same = area()
    assert area() == same
    others = [area(loader.TrainTransform(size=64)), area(batch_size=4), area(coordinate="another name")]
    assert same not in others and len(set(others)) == 3


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_stale_area_left_by_a_crashed_group_is_removed_at_the_next_start(tmp_path, shm_dir):
    config = dict(data="indexed", samples=96, group="stale", staging=str(shm_dir), epochs=1, step=0.2)
    (tmp_path / "c.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    job = Path(__file__).with_name("_coordinated_job.py")
    crashed = subprocess.Popen(
        [sys.executable, str(job), str(tmp_path / "c.json")], env=env, stdout=subprocess.PIPE, text=True
    )
    while crashed.stdout.readline().strip() != "batch 0 1":
        pass
    crashed.kill()  # SIGKILL
    crashed.communicate()
    (left,) = shm_dir.iterdir()
    assert any(p.name.startswith("b-") for p in left.iterdir())  # staged batches of the crashed group
    # the same group again; its steps need not be slow (that only let the first be killed mid-epoch)
    (tmp_path / "again.json").write_text(json.dumps({**config, "step": 0.0}))
    done = subprocess.run(
        [sys.executable, str(job), str(tmp_path / "again.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"batches_consumed": 12' in done.stdout and not list(shm_dir.iterdir())


class BadSample(Indexed):
    def __getitem__(self, i: int):
        if i == 13:
            raise OSError("sample 13 is unreadable")
        return super().__getitem__(i)


@pytest.mark.multiproc
@pytest.mark.parametrize("workers", [0, 1])
def test_a_batch_that_cannot_be_prepared_raises_its_error_instead_of_waiting(shm_dir, workers):
    options = loader.Coordination(group="bad", staging_dir=str(shm_dir))
    dl = loader.DataLoader(BadSample(N), batch_size=8, num_workers=workers, coordinate=options)
    with pytest.raises((OSError, loader.PrepFailed), match="sample 13 is unreadable") as raised:
        list(dl)
    # prepared in a worker (the usual case): the error names the batch and its samples. On a busy machine the
    # main process may claim the batch first (its worker still starting) and raise the sample's own error,
    # as torch's loader does without workers
    named = isinstance(raised.value, loader.PrepFailed)
    assert workers > 0 or not named  # no worker: the sample's own error, here
    if named:
        assert "batch 1 of epoch 0" in str(raised.value) and "13" in str(raised.value)
    del dl, raised
    gc.collect()
    assert not list(shm_dir.iterdir())
