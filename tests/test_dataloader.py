"""loader.DataLoader against torch's: same signature, same order, plus cache, stats, resume, bad records."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.utils.data
from _conformance_data import multi_epochs
from helpers import MemorySource, first_index, make_jpeg_folder

import loader
from loader import DataLoader, SourceDataset
from loader.cache._layout import index_bytes

TORCH_PARAMS = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
OUR_PARAMS = inspect.signature(DataLoader.__init__).parameters


@pytest.mark.parametrize("name", list(TORCH_PARAMS))
def test_every_torch_parameter_exists_with_the_same_default_and_kind(name):
    theirs, ours = TORCH_PARAMS[name], OUR_PARAMS[name]
    assert (ours.default, ours.kind) == (theirs.default, theirs.kind)
    assert list(OUR_PARAMS)[: len(TORCH_PARAMS)] == list(TORCH_PARAMS)


def test_our_options_are_keyword_only():
    extra = [p for n, p in OUR_PARAMS.items() if n not in TORCH_PARAMS]
    expected = {
        "cache_bytes",
        "cache_dir",
        "on_error",
        "readahead",
        "coordinate",
        "partition_cache",
        "cache_form",
        "cache_files",
        "ready_first",
    }
    assert {p.name for p in extra} == expected
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra)


def batches(dl) -> list:
    return [[t.tolist() if isinstance(t, torch.Tensor) else t for t in b] for b in dl]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_plain_dataset_gives_what_torch_gives(num_workers):
    data = torch.utils.data.TensorDataset(torch.arange(50), torch.arange(50) * 2)
    kw = dict(batch_size=4, shuffle=True, num_workers=num_workers, drop_last=True)
    theirs = torch.utils.data.DataLoader(data, generator=torch.Generator().manual_seed(3), **kw)
    ours = DataLoader(data, generator=torch.Generator().manual_seed(3), **kw)
    assert batches(ours) == batches(theirs)
    assert len(ours) == len(theirs) == 12
    assert ours.stats().batches_collated == 0  # nothing instrumented: it is torch's loader


@pytest.mark.parametrize("num_workers", [0, 2])
def test_source_dataset_keeps_torch_order(num_workers, shm_dir):
    data = SourceDataset(MemorySource(30), transform=first_index)
    kw = dict(batch_size=5, shuffle=True, num_workers=num_workers)
    theirs = torch.utils.data.DataLoader(data, generator=torch.Generator().manual_seed(1), **kw)
    ours = DataLoader(
        data, generator=torch.Generator().manual_seed(1), cache_bytes=1 << 20, cache_dir=shm_dir, **kw
    )
    for _ in range(2):
        assert batches(ours) == batches(theirs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_timm_s_multi_epochs_loader_reads_through_the_cache(num_workers, shm_dir):
    """timm's loader (one iterator kept for good over an endless batch sampler) over ours with a cache:
    torch's batches every epoch, every record a hit after the first."""
    data = SourceDataset(MemorySource(30), transform=first_index)
    kw = dict(batch_size=5, shuffle=True, num_workers=num_workers, persistent_workers=num_workers > 0)
    theirs = multi_epochs(torch.utils.data.DataLoader)(data, generator=torch.Generator().manual_seed(1), **kw)
    ours = multi_epochs(DataLoader)(
        data, generator=torch.Generator().manual_seed(1), cache_bytes=1 << 20, cache_dir=shm_dir, **kw
    )
    for _ in range(3):
        assert batches(ours) == batches(theirs)
    stats, ahead = ours.stats(), 2 * 2 * 5 if num_workers else 0  # the workers' prefetch of epoch 4
    assert stats.records_admitted == 30 and 60 <= stats.hits <= 60 + ahead  # a record two workers missed


def test_an_endless_sampler_swapped_in_is_refused_where_the_epochs_are_planned(shm_dir):
    data = SourceDataset(MemorySource(8), transform=first_index)
    with pytest.raises(TypeError, match="batch_sampler has no len"):
        multi_epochs(DataLoader)(data, batch_size=2, coordinate=f"timm-{shm_dir.name}", cache_bytes=1 << 20)


def test_batch_size_none_and_custom_collate(shm_dir):
    data = SourceDataset(MemorySource(6), transform=first_index)
    single = DataLoader(data, batch_size=None, cache_bytes=1 << 20, cache_dir=shm_dir)
    assert [s for s, _ in single] == list(range(6))
    joined = DataLoader(data, batch_size=3, collate_fn=lambda b: sum(s for s, _ in b))
    assert list(joined) == [3, 12]


def half_cache(n: int, size: int) -> int:
    return index_bytes(n) + (n // 2) * size


@pytest.mark.parametrize(("num_workers", "readahead"), [(0, 0), (0, 4), (2, 0), (2, 4)])
def test_half_cache_hits_exactly_what_it_admitted_each_epoch(num_workers, readahead, shm_dir):
    n, size = 64, 512
    data = SourceDataset(MemorySource(n, size), transform=first_index)
    dl = DataLoader(
        data,
        readahead=readahead,
        batch_size=8,
        shuffle=True,
        num_workers=num_workers,
        cache_bytes=half_cache(n, size),
        cache_dir=shm_dir,
    )
    seen = [sorted(i for b in dl for i in b[0].tolist())]
    first = dl.stats()
    assert (first.hits, first.records_admitted, first.records_cached) == (0, n // 2, n // 2)
    for _ in range(2):
        before = dl.stats()
        seen.append(sorted(i for b in dl for i in b[0].tolist()))
        after = dl.stats()
        assert after.hits - before.hits == first.records_admitted
        assert after.misses - before.misses == n - first.records_admitted
        assert after.records_admitted == first.records_admitted  # never evicts, never re-admits
    assert seen == [list(range(n))] * 3  # no record lost or repeated


def test_stats_time_every_stage_and_count_bytes(tmp_path, shm_dir):
    dl = DataLoader(
        loader.ImageFolder(make_jpeg_folder(tmp_path / "imgs"), transform="eval"),
        batch_size=4,
        cache_bytes=1 << 22,
        cache_dir=shm_dir,
    )
    images, labels = next(iter(dl))
    assert images.shape == (4, 3, 224, 224) and images.dtype == torch.uint8 and labels.tolist() == [0] * 4
    list(dl)
    s = dl.stats()
    assert s.fetch_seconds > 0 and s.decode_seconds > 0 and s.collate_seconds > 0
    assert s.samples == 8 + 4 and s.batches_collated == 3
    assert s.bytes_from_cache > 0 and s.bytes_from_source + s.bytes_from_cache > 0
    assert 0 < s.hit_rate < 1 and s.cache_capacity == 1 << 22


def test_corrupt_record_is_named_or_skipped_and_counted(tmp_path, shm_dir):
    root = make_jpeg_folder(tmp_path / "imgs")
    bad = root / "class1" / "img001.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated JPEG
    data = loader.ImageFolder(root, transform="eval")
    with pytest.raises(loader.BadRecordError, match=r"record 5 .*img001\.jpg"):
        list(DataLoader(data, batch_size=4))
    skipping = DataLoader(data, batch_size=4, on_error="skip", cache_bytes=1 << 22, cache_dir=shm_dir)
    sizes = [len(labels) for _, labels in skipping]
    assert sizes == [4, 3] and skipping.stats().records_skipped == 1


def test_batch_of_only_bad_records_is_dropped():
    source = MemorySource(6)
    source.records[2] = source.records[3] = None
    dl = DataLoader(SourceDataset(source, transform=first_index), batch_size=2, on_error="skip")
    assert [b[0].tolist() for b in dl] == [[0, 1], [4, 5]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"on_error": "ignore"}, "on_error"),
        ({"readahead": -1}, "readahead"),
        ({"cache_bytes": -1}, "cache_bytes"),
        ({"cache_bytes": 10}, "cache_bytes"),
    ],
)
def test_bad_options_are_named(kwargs, match, shm_dir):
    with pytest.raises(ValueError, match=match):
        DataLoader(SourceDataset(MemorySource(4)), cache_dir=shm_dir, **kwargs)


def test_cache_on_a_plain_dataset_warns():
    with pytest.warns(UserWarning, match="cache_bytes is ignored"):
        DataLoader(torch.utils.data.TensorDataset(torch.arange(3)), cache_bytes=1 << 20)


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_resume_mid_epoch_gives_the_same_rest(num_workers, persistent, shm_dir):
    def make():
        data = SourceDataset(MemorySource(40), transform=first_index)
        return DataLoader(
            data,
            batch_size=3,
            shuffle=True,
            num_workers=num_workers,
            persistent_workers=persistent,
            generator=torch.Generator().manual_seed(7),
            cache_bytes=1 << 20,
            cache_dir=shm_dir,
        )

    original = make()
    list(original)  # one whole epoch first, so the state is not just the start
    it = iter(original)
    head = [next(it)[0].tolist() for _ in range(5)]
    state = original.state_dict()
    rest = [b[0].tolist() for b in it] + [b[0].tolist() for b in original]  # rest of epoch 2, then epoch 3
    restored = make()
    restored.load_state_dict(state)
    again = [b[0].tolist() for b in restored] + [b[0].tolist() for b in restored]
    assert len(head) + len(again) == 2 * len(original) and again == rest


def test_state_dict_rejects_what_it_cannot_resume():
    data = SourceDataset(MemorySource(4))
    with pytest.raises(ValueError, match="version"):
        DataLoader(data).load_state_dict({"epoch_order": []})
    with pytest.raises(ValueError, match="version 2 to 4, got 1"):
        DataLoader(data).load_state_dict(
            {"version": 1, "epoch_order": [[0]], "batches_delivered": 5, "generators": {}}
        )
    with pytest.raises(ValueError, match="batches_delivered=-1 is not a number of batches"):
        DataLoader(data).load_state_dict(
            {"version": 2, "draw_states": {}, "batches_delivered": -1, "epoch_finished": False}
        )


def test_distributed_sampler_splits_as_in_torch(shm_dir):
    data = SourceDataset(MemorySource(21), transform=first_index)
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=4)
        theirs = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
        ours = DataLoader(data, batch_size=4, sampler=sampler, cache_bytes=1 << 20, cache_dir=shm_dir)
        assert batches(ours) == batches(theirs)


def record_worker(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.seen_by = worker_id


def test_worker_options_pass_through(shm_dir):
    data = SourceDataset(MemorySource(16), transform=first_index)
    dl = DataLoader(
        data,
        batch_size=2,
        num_workers=2,
        prefetch_factor=3,
        persistent_workers=True,
        worker_init_fn=record_worker,
        cache_bytes=1 << 20,
        cache_dir=shm_dir,
    )
    assert (dl.prefetch_factor, dl.persistent_workers, dl.worker_init_fn) == (3, True, record_worker)
    for _ in range(2):
        assert sorted(i for b in dl for i in b[0].tolist()) == list(range(16))
    assert dl.stats().samples == 32


def test_pin_memory_behaves_as_in_torch():
    data = SourceDataset(MemorySource(4), transform=first_index)
    with pytest.warns(UserWarning) as theirs:
        list(torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True))
    with pytest.warns(UserWarning) as ours:
        out = [b[0].tolist() for b in DataLoader(data, batch_size=2, pin_memory=True)]
    assert out == [[0, 1], [2, 3]]
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]


@pytest.mark.multiproc
def test_bad_record_in_a_worker_is_still_a_bad_record_error():
    source = MemorySource(8)
    source.records[5] = None
    dl = DataLoader(SourceDataset(source, transform=first_index), batch_size=2, num_workers=2)
    with pytest.raises(
        loader.BadRecordError, match=r"(?s)worker process.*record 5 \(memory\[5\]\)"
    ) as caught:
        list(dl)
    assert (caught.value.index, caught.value.where, caught.value.reason) == (
        5,
        "memory[5]",
        "record is missing",
    )


def resumable(num_workers: int, shm_dir, persistent: bool = False) -> DataLoader:
    return DataLoader(
        SourceDataset(MemorySource(40), transform=first_index),
        batch_size=3,
        shuffle=True,
        num_workers=num_workers,
        persistent_workers=persistent,
        generator=torch.Generator().manual_seed(7),
        cache_bytes=1 << 20,
        cache_dir=shm_dir,
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_loader_counts_from_where_it_resumed(num_workers, shm_dir):
    original = resumable(num_workers, shm_dir)
    it = iter(original)
    next(it)
    first = resumable(num_workers, shm_dir)
    first.load_state_dict(original.state_dict())
    again = iter(first)
    next(again)
    state = first.state_dict()
    assert state["batches_delivered"] == 2
    second = resumable(num_workers, shm_dir)
    second.load_state_dict(state)
    assert [b[0].tolist() for b in second] == [b[0].tolist() for b in again]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_saved_before_the_first_batch_gives_that_epoch(num_workers, shm_dir):
    original = resumable(num_workers, shm_dir)
    it = iter(original)  # with workers, making the iterator already drew the epoch's order
    state = original.state_dict()
    restored = resumable(num_workers, shm_dir)
    restored.load_state_dict(state)
    assert [b[0].tolist() for b in restored] == [b[0].tolist() for b in it]


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_a_state_saved_before_the_first_iterator_gives_the_first_epoch(num_workers, persistent, shm_dir):
    original = resumable(num_workers, shm_dir, persistent)
    state = original.state_dict()
    restored = resumable(num_workers, shm_dir, persistent)
    restored.load_state_dict(state)
    for _ in range(2):
        assert [b[0].tolist() for b in restored] == [b[0].tolist() for b in original]


def test_an_image_folder_job_loads_neither_pyarrow_nor_lmdb_nor_psutil(tmp_path, shm_dir):
    """Each process of an image-folder job holds only what its dataset needs (pyarrow and lmdb: ~44 MB;
    psutil, which only a partitioned cache's inbox needs: 0.8 MiB)."""
    import subprocess
    import sys

    root = make_jpeg_folder(tmp_path / "imgs", per_class=2, classes=2, size=(8, 8))
    code = (
        "import sys, torch, loader\n"
        "def seen(_):\n"
        "    return [sorted(m for m in ('pyarrow', 'lmdb', 'psutil') if m in sys.modules)]\n"
        f"dl = loader.DataLoader(loader.ImageFolder({str(root)!r}), batch_size=2, num_workers=2,\n"
        f"                       cache_bytes=1 << 20, cache_dir={str(shm_dir)!r}, collate_fn=seen)\n"
        "print([m for batch in dl for m in batch] + seen(None))\n"
        "loader.ArrowSource, loader.LMDBSource\n"
        "print(seen(None))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[[], [], []]", "[['lmdb', 'pyarrow']]"]  # named: imported then


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_fn_set_after_init_is_used_as_torchs_and_keeps_the_stats(tmp_path, workers):
    """Torch lets ``collate_fn`` be set on a made loader; ours uses it too, and stats() still counts every
    record (each batch's collate publishes the counts: an unwrapped one lost the first epoch's)."""
    source = MemorySource(40)
    ours = DataLoader(
        SourceDataset(source), batch_size=8, num_workers=workers, cache_bytes=1 << 20, cache_dir=tmp_path
    )
    theirs = torch.utils.data.DataLoader(SourceDataset(source), batch_size=8, num_workers=workers)
    ours.collate_fn = theirs.collate_fn = list
    assert [list(ours) for _ in range(2)] == [list(theirs)] * 2
    stats = ours.stats()
    assert (stats.misses, stats.hits, stats.samples) == (40, 40, 80)
