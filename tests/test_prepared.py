"""The cache holding records prepared (``cache_form``): exact samples, the choice by measurement, refusals,
the stored layout, a killed worker and a restart."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data
from helpers import MemorySource, make_jpeg_folder
from PIL import Image

from loader import DataLoader, EvalTransform, ImageFolder, SourceDataset, Staged, TrainTransform
from loader.cache._layout import index_bytes
from loader.fetching.staged import decode_prepared, encode_prepared
from loader.form.choice import probe
from loader.form.weighing import Probe, weigh

SMALL = TrainTransform(size=32)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_jpeg_folder(tmp_path_factory.mktemp("prepared") / "imgs", per_class=12, classes=2)


def epochs(dl, n: int = 2) -> list[list[tuple[list, list]]]:
    return [[(x.tolist(), y.tolist()) for x, y in dl] for _ in range(n)]


def make(dataset, shm_dir, workers=2, **kw) -> DataLoader:
    kw = {"batch_size": 5, "shuffle": True, "generator": torch.Generator().manual_seed(7), **kw}
    if workers:
        kw["timeout"] = 120
    return DataLoader(dataset, num_workers=workers, cache_dir=shm_dir, **{"cache_bytes": 1 << 24, **kw})


STAGED_KINDS = [
    SMALL,
    EvalTransform(resize=40, size=32),
    Staged(lambda raw: np.frombuffer(raw, np.uint8), np.flip),
]


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("transform", STAGED_KINDS)
def test_a_miss_prepares_and_augments_as_the_two_stages_apart(mode, transform):
    """``prepare_augment`` (the built-in train transform crops the decoded image, not its array) stores and
    gives what ``prepare`` then ``augment`` would, with the same random draws."""
    buf = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 255, (50, 70, 3), np.uint8)
    Image.fromarray(pixels).convert(mode).save(buf, "JPEG")
    random.seed(5)
    prepared = transform.prepare(buf.getvalue())
    want = (prepared, transform.augment(prepared), random.random())
    random.seed(5)
    got = (*transform.prepare_augment(buf.getvalue()), random.random())
    assert [type(v) for v in got] == [type(v) for v in want]
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    assert got[2] == want[2]  # the same draws, no more


@pytest.mark.multiproc
@pytest.mark.parametrize("workers", [0, 2])
def test_prepared_train_samples_are_the_undrafted_transforms_bit_for_bit(images, shm_dir, workers):
    reference = torch.utils.data.DataLoader(
        ImageFolder(images, transform=TrainTransform(size=32, draft=False)),
        batch_size=5,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(7),
    )
    ours = make(ImageFolder(images, transform=SMALL), shm_dir, workers, cache_form="prepared")
    random.seed(3)
    want = epochs(reference)
    random.seed(3)
    got = epochs(ours)  # epoch 1 prepares every record, epoch 2 reads them all prepared
    assert got == want
    stats = ours.stats()
    assert (stats.misses, stats.hits, stats.records_admitted) == (24, 24, 24)
    assert stats.cache_form == "prepared" and stats.cache_form_reason.startswith("asked for; weighed: ")
    assert set(stats.cache_form_epochs) >= {"raw", "prepared"}


def test_prepared_eval_samples_are_the_transforms_own(images, shm_dir):
    transform = EvalTransform(resize=40, size=32)
    plain = ImageFolder(images, transform=None)
    reference = [(transform(plain.source.read(i)), plain.source.label(i)) for i in range(len(plain))]
    dl = make(ImageFolder(images, transform=transform), shm_dir, 0, shuffle=False, batch_size=None)
    for _ in range(2):
        assert [(x.tolist(), y) for x, y in dl] == [(x.tolist(), y) for x, y in reference]
    assert dl.stats().cache_form in ("raw", "prepared")  # auto: whichever it measured faster


def test_the_draft_shortcut_differs_from_a_prepared_record_by_a_bounded_amount(tmp_path, shm_dir):
    """Where a crop keeps at least twice the output size, the uncached path decodes the JPEG at a reduced
    scale; a prepared record is decoded whole. Same crops and flips; pixels within the bound documented in
    docs/concepts/prepared-cache.md (mean absolute difference under 4 of 255, per sample)."""
    root = tmp_path / "big" / "a"
    root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for k in range(6):  # smooth images, as photographs are: a gradient and some noise
        ramp = np.linspace(0, 255, 960, dtype=np.float32)[None, :, None] * np.ones((720, 1, 3), np.float32)
        pixels = np.clip(ramp + rng.normal(0, 8, (720, 960, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / f"{k}.jpg", quality=90)
    transform = TrainTransform(size=64, scale=(0.5, 1.0))
    drafted = ImageFolder(root.parent, transform=transform)
    random.seed(5)
    want = [drafted[i][0] for i in range(6)]
    dl = make(ImageFolder(root.parent, transform=transform), shm_dir, 0, shuffle=False, batch_size=None)
    random.seed(5)
    got = [x for x, _ in dl]
    differences = [float((a.float() - b.float()).abs().mean()) for a, b in zip(got, want, strict=True)]
    assert max(differences) < 4.0 and any(d > 0 for d in differences)  # the draft was taken, and is close


def test_a_staged_user_transform_is_held_prepared(shm_dir):
    calls = {"prepare": 0}

    def prepare(raw: bytes) -> np.ndarray:
        calls["prepare"] += 1
        return np.frombuffer(raw, np.uint8).astype(np.int16) * 2

    def augment(prepared: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(prepared[:4] + random.randint(0, 0))

    transform = Staged(prepare, augment)
    assert transform.identity.startswith("Staged:") and "prepare" in transform.identity
    source = MemorySource(10, 64)
    dl = make(SourceDataset(source, transform=transform), shm_dir, 0, shuffle=False, cache_form="prepared")
    calls["prepare"] = 0
    first, second = epochs(dl)
    assert first == second and calls["prepare"] == 10  # the second epoch prepared nothing
    expected = [
        (np.frombuffer(source.read(i), np.uint8)[:4].astype(np.int16) * 2).tolist() for i in range(10)
    ]
    assert [row for x, _ in first for row in x] == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cache_form": "cooked"}, "cache_form must be one of 'auto', 'raw', 'prepared'"),
        ({"cache_form": "prepared", "transform": lambda raw: raw}, "needs a staged transform"),
        ({"cache_form": "prepared", "cache_bytes": None}, "needs a cache: set cache_bytes"),
        ({"cache_form": "prepared", "partition_cache": True}, "cannot hold them prepared"),
    ],
)
def test_bad_forms_are_named(images, shm_dir, kwargs, message):
    transform = kwargs.pop("transform", SMALL)
    kwargs = {"cache_bytes": 1 << 24, **kwargs}
    with pytest.raises(ValueError, match=message):
        DataLoader(ImageFolder(images, transform=transform), cache_dir=shm_dir, **kwargs)


def test_a_form_needs_a_source_backed_dataset(shm_dir, tmp_path):
    with pytest.raises(ValueError, match="cache_form needs a source-backed dataset, not TensorDataset"):
        DataLoader(torch.utils.data.TensorDataset(torch.arange(4)), cache_form="raw")
    with pytest.raises(ValueError, match="cache_files holds raw bytes only"):
        DataLoader(
            torch.utils.data.TensorDataset(torch.arange(4)),
            cache_bytes=1 << 20,
            cache_dir=shm_dir,
            cache_files=tmp_path,
            cache_form="prepared",
        )


def test_a_one_stage_transform_is_cached_raw(images, shm_dir):
    dl = make(ImageFolder(images, transform=lambda raw: torch.tensor(len(raw))), shm_dir, 0)
    epochs(dl)
    assert dl.stats().cache_form == "raw" and "one stage" in dl.stats().cache_form_reason


def prober(**values: float) -> Probe:
    base = dict(fetch=1e-4, prepare=2e-3, augment=2e-4, whole=2e-3, raw_bytes=60e3, prepared_bytes=500e3)
    return Probe(**{**base, **values})


def test_the_choice_weighs_the_predicted_epochs():
    records = 1000
    assert weigh(prober(), records, room=600e6, workers=2).form == "prepared"  # prep-bound, room for all
    fetch_bound = prober(fetch=20e-3)  # 20 ms a record from storage: misses dominate
    assert weigh(fetch_bound, records, room=100e6, workers=2).form == "raw"  # raw fits all, prepared 200
    assert weigh(prober(), records, room=40e6, workers=2).form == "raw"  # 80 prepared fit: little gain
    said = weigh(prober(), records, room=600e6, workers=2).reason
    assert "prepare 2.00 ms" in said and "1000 of 1000 fit prepared" in said
    warm = prober(from_storage=0.0)  # the probe read the page cache: storage's cost is unknown
    assert weigh(warm, records, room=600e6, workers=2).form == "prepared"  # all fit: no more misses
    mixed = weigh(warm, records, room=300e6, workers=2)  # 600 fit prepared, 1000 raw: 400 more misses
    assert "the storage reads of the 400 more misses prepared would make" in mixed.reason
    # a mix with no miss more: 539 prepared (500 kB) and 461 raw (60 kB, planned at 66 kB) fill the room
    assert mixed.form == "mixed" and "mixed 0.51 s with 539 prepared and 461 raw" in mixed.reason
    assert mixed.prepared_room == 539 * 500e3


def test_a_mix_is_weighed_against_each_form_alone():
    records = 1000
    timed = weigh(prober(), records, room=300e6, workers=2)  # misses cost 0.1 ms: 600 prepared beat a mix
    assert timed.form == "prepared" and timed.prepared_room == 0 and "mixed" in timed.reason
    fetch_bound = weigh(prober(fetch=20e-3, from_storage=0.0), records, room=300e6, workers=2)
    assert fetch_bound.form == "mixed"  # raw all fit: no miss more, 539 records no longer prepared each epoch
    slow_storage = weigh(prober(fetch=20e-3), records, room=300e6, workers=2)
    assert slow_storage.form == "mixed" and "4.00 s prepared" in slow_storage.reason  # 400 misses at 20 ms
    no_room_for_both = weigh(prober(fetch=3e-3), records, room=61e6, workers=2)  # all raw take the room
    assert no_room_for_both.form == "raw"


def test_the_probe_leaves_the_random_modules_as_they_were(images):
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    want = random.random(), np.random.random(), torch.rand(1).item()
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    measured = probe(ImageFolder(images, transform=SMALL))
    assert (random.random(), np.random.random(), torch.rand(1).item()) == want
    assert measured.prepared_bytes > measured.raw_bytes > 0 and measured.prepare > 0


def test_the_stored_layout_round_trips_whole_values():
    value = {
        "pixels": np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
        "t": (torch.arange(6, dtype=torch.float32).reshape(2, 3), [1, 2.5, "x", None, True]),
        "raw": b"\x00\x01",
    }
    back = decode_prepared(encode_prepared(value))
    assert back["pixels"].tolist() == value["pixels"].tolist() and back["pixels"].dtype == np.uint8
    assert back["pixels"].flags.writeable and isinstance(back["t"][0], torch.Tensor)
    assert back["t"][0].tolist() == value["t"][0].tolist() and back["t"][1] == [1, 2.5, "x", None, True]
    assert back["raw"] == b"\x00\x01" and isinstance(back["t"], tuple)
    owned = encode_prepared(value)
    back = decode_prepared(owned, own=True)  # the arrays are views of the bytearray handed over
    assert back["pixels"].tolist() == value["pixels"].tolist() and back["pixels"].flags.writeable
    assert np.shares_memory(back["pixels"], np.frombuffer(owned, np.uint8))
    assert back["t"][0].tolist() == value["t"][0].tolist() and back["raw"] == b"\x00\x01"
    for k in range(1, 9):  # a first array of k bytes that leaves the floats off an 8-byte boundary
        odd = encode_prepared((np.zeros(k, np.uint8), np.arange(3, dtype=np.float64)))
        if (4 + int.from_bytes(odd[:4], "little") + k) % 8:
            break
    floats = decode_prepared(odd, own=True)[1]  # copied, not viewed: aligned for its type
    assert floats.tolist() == [0.0, 1.0, 2.0] and floats.flags.aligned
    assert not np.shares_memory(floats, np.frombuffer(odd, np.uint8))
    for k in range(1, 9):  # whatever the header's length, a record's first array is viewed, not copied
        alone = encode_prepared({"x" * k: np.arange(3, dtype=np.float64)})
        viewed = decode_prepared(alone, own=True)["x" * k]
        assert viewed.tolist() == [0.0, 1.0, 2.0] and np.shares_memory(viewed, np.frombuffer(alone, np.uint8))
    fields = np.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i4"), ("b", "<f8")])
    assert decode_prepared(encode_prepared(fields)).tolist() == fields.tolist()  # the fields keep their names
    assert decode_prepared(encode_prepared(fields)).dtype == fields.dtype
    as_array = np.frombuffer(bytearray(owned), np.uint8)  # a disk store hands a hit over so, never zeroed
    back = decode_prepared(as_array, own=True)
    assert back["pixels"].tolist() == value["pixels"].tolist() and np.shares_memory(back["pixels"], as_array)
    with pytest.raises(ValueError, match="own=True takes writable bytes"):
        decode_prepared(bytes(owned), own=True)
    with pytest.raises(TypeError, match="cannot hold a Image"):
        encode_prepared(Image.new("L", (2, 2)))
    with pytest.raises(TypeError, match="array of Python objects"):
        encode_prepared(np.array([object()]))
    with pytest.raises(ValueError, match="not a prepared record"):
        decode_prepared(b"\x05\x00\x00\x00{bad}")
    with pytest.raises(ValueError, match="shorter than its header"):
        decode_prepared(encode_prepared(np.zeros(10))[:-1])


KILLED_WORKER = """
import os, signal, sys, loader
ds = loader.ImageFolder(sys.argv[1], transform=loader.TrainTransform(size=32))
dl = loader.DataLoader(ds, batch_size=5, num_workers=2, cache_bytes=1 << 24, cache_dir=sys.argv[2],
                       cache_form="prepared", timeout=120)
it = iter(dl)
next(it)
victim = it._workers[0].pid
try:  # torch's SIGCHLD handler raises as soon as the worker dies: the kill too is inside the try
    os.kill(victim, signal.SIGKILL)  # while it prepares its share of the epoch
    for _ in it:
        pass
except RuntimeError as exc:  # torch names the dead worker
    print(f"killed {victim}" if str(victim) in str(exc) else exc)
except (EOFError, ConnectionError):  # or the batch it was handing over broke off (torch's own race)
    print(f"killed {victim}")
"""
RESTARTED = """
import sys, loader
ds = loader.ImageFolder(sys.argv[1], transform=loader.TrainTransform(size=32))
dl = loader.DataLoader(ds, batch_size=5, num_workers=2, cache_bytes=1 << 24, cache_dir=sys.argv[2],
                       cache_form="prepared")
for _ in range(2):
    labels = sorted(y for _, ys in dl for y in ys.tolist())
s = dl.stats()
print(labels == [0] * 12 + [1] * 12, s.hits, s.misses, s.records_cached)
"""


@pytest.mark.multiproc
def test_a_worker_killed_while_preparing_loses_nothing_and_a_new_process_reads_the_store(images, shm_dir):
    """Each in a process of its own, as users run them (a killed worker's SIGCHLD stays out of pytest's)."""
    argv = [sys.executable, "-c", "", str(images), str(shm_dir)]
    runs = []
    for code in (KILLED_WORKER, RESTARTED):
        argv[2] = code
        runs.append(subprocess.run(argv, capture_output=True, text=True, timeout=180))
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    killed, victim = runs[0].stdout.split()
    assert killed == "killed"
    # torch's own race, not ours: a worker killed between making a batch's shared segment and unlinking
    # it leaves ``torch_<pid>_*`` (torch's loader alike); everything of ours must be gone (no_shm_leak)
    for segment in Path("/dev/shm").glob(f"torch_{victim}_*"):
        segment.unlink()
    ok, hits, misses, cached = runs[1].stdout.split()
    assert ok == "True" and int(cached) == 24 and int(hits) + int(misses) == 48 and int(misses) < 24
    assert int(hits) >= 24  # the second epoch reads every record prepared; the first, what survived the kill


def test_a_stored_prepared_record_that_fails_its_check_is_prepared_again(images, shm_dir):
    transform = EvalTransform(40, 32)
    dl = make(ImageFolder(images, transform=transform), shm_dir, 0, shuffle=False, cache_form="prepared")
    first = epochs(dl, 1)[0]
    store = dl.cache
    used = store.info().bytes_used
    for k in range(4):  # bytes flipped across the records, as a stray write would
        os.pwrite(store._data_fd, b"\xff" * 64, k * used // 4 + 100)
    assert epochs(dl, 1)[0] == first  # each failed its check: prepared again from the source
    stats = dl.stats()
    assert 0 < stats.records_corrupt < 24 and stats.hits == 24 - stats.records_corrupt


def slow_prepare(raw: bytes) -> np.ndarray:
    time.sleep(0.004)  # the decode a prepared record saves
    return np.frombuffer(raw, np.uint8).astype(np.int64)  # 8x the raw bytes


def jitter(prepared: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(prepared[:6] + int(torch.randint(0, 100, ())))


class SlowSource(MemorySource):
    """Records that take 20 ms to read: the ~6 misses a prepared record more would cost outweigh the
    prepare it saves, so the mix holds every record, whether or not the probe counts its reads as timed
    storage (a lazy import's read from the device may make it so)."""

    def read(self, index: int) -> bytes:
        time.sleep(0.02)
        return super().read(index)


def mixed_loader(shm_dir, workers: int, source: MemorySource, **kw) -> DataLoader:
    """Room for every record raw and about half of them prepared."""
    room = len(source) * 1000 * 11 // 10 + len(source) // 2 * 8100 + 2 * index_bytes(len(source))
    dataset = SourceDataset(source, transform=Staged(slow_prepare, jitter, identity="slow x8"))
    return make(dataset, shm_dir, workers, cache_bytes=room, **kw)


@pytest.mark.multiproc
@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_of_forms_gives_the_uncached_samples_bit_for_bit(shm_dir, workers):
    source = SlowSource(40, 1000)
    reference = torch.utils.data.DataLoader(
        SourceDataset(source, transform=Staged(slow_prepare, jitter)),
        batch_size=5,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(7),
    )
    ours = mixed_loader(shm_dir, workers, source)
    torch.manual_seed(5)
    want = epochs(reference, 3)
    torch.manual_seed(5)
    got = epochs(ours, 3)  # epoch 1 fills both stores; 2 and 3 read every record from one of them
    assert got == want
    stats = ours.stats()
    assert stats.cache_form == "mixed", stats.cache_form_reason
    assert (stats.misses, stats.hits, stats.records_cached) == (40, 80, 40)  # no record held twice
    predicted = stats.cache_form_epochs
    assert set(predicted) == {"raw", "prepared", "mixed"} and predicted["mixed"] < 0.9 * predicted["raw"]


def test_a_mix_prepares_again_only_the_records_it_holds_raw(shm_dir, monkeypatch):
    calls, prepare = [], slow_prepare
    monkeypatch.setattr(sys.modules[__name__], "slow_prepare", lambda raw: calls.append(1) or prepare(raw))
    dl = mixed_loader(shm_dir, 0, SlowSource(40, 1000), shuffle=False)
    list(dl)
    first = len(calls)
    list(dl)
    again = len(calls) - first
    stats = dl.stats()
    assert stats.cache_form == "mixed" and 8 <= again <= 32  # the raw share: about half
    assert stats.records_cached == 40 and stats.cache_bytes_used >= again * 1000 + (40 - again) * 8000


MIX_RUN = """
import sys, warnings
from pathlib import Path
sys.path[:0] = [sys.argv[2]]
warnings.simplefilter("error")  # a restart with the same cache_bytes finds its stores as it made them
import test_prepared
dl = test_prepared.mixed_loader(Path(sys.argv[1]), 0, test_prepared.SlowSource(40, 1000), shuffle=False)
list(dl)
s = dl.stats()
print(s.cache_form, s.hits, s.misses, s.records_cached)
"""


def test_a_mix_survives_a_restart_in_a_new_process(shm_dir):
    argv = [sys.executable, "-c", MIX_RUN, str(shm_dir), os.path.dirname(__file__)]
    runs = [subprocess.run(argv, capture_output=True, text=True, timeout=120) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    assert [r.stdout.split() for r in runs] == [["mixed", "0", "40", "40"], ["mixed", "40", "0", "40"]]


def test_a_loader_made_again_over_the_same_data_does_not_probe_again(shm_dir):
    calls = []

    def prepare(raw: bytes) -> np.ndarray:
        calls.append(1)
        return np.frombuffer(raw, np.uint8).copy()

    transform = Staged(prepare, lambda pixels: torch.from_numpy(pixels[:2]), identity="made again")
    dataset = SourceDataset(MemorySource(16, 64, salt="made again"), transform=transform)
    make(dataset, shm_dir, 0)
    probed = len(calls)
    make(dataset, shm_dir, 0)  # an evaluation loader built at every evaluate()
    assert probed == 2 * 9 and len(calls) == probed  # 8 records and an untimed first, each prepared twice
