"""``cache_files=`` steps aside for files the page cache holds: after ``PASS_AFTER`` misses in a row found
wholly resident, a process's reads go to the real ``open`` (counted as ``files_passed``) but for a probe
every ``PROBE_EVERY``-th read; a probe that finds its file gone from the page cache turns serving back on,
and a store filled from storage keeps serving. The batches are torch's whatever the process does."""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path

import pytest
import torch.utils.data

import loader
from loader.serving import files as served_files
from loader.serving import stepping_aside
from loader.serving.files import ROOM_SHARE, CachedFiles
from loader.serving.open_hook import FileReads
from loader.serving.stepping_aside import PASS_AFTER, PROBE_EVERY, SteppingAside
from loader.stats.board import StatsBoard
from loader.system import memory, pagecache
from loader.system.pagecache import evict_file
from loader.system.sizing import reserve_bytes

FILES, BATCH = 3 * PASS_AFTER + 8, 8
FORK_WARNING = "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"


@pytest.fixture
def tree(tmp_path: Path) -> list[str]:
    """FILES small files of distinct bytes, written (so the page cache holds them) and synced (so it can
    give them back)."""
    root = tmp_path / "data"
    root.mkdir()
    paths = []
    for i in range(FILES):
        path = root / f"{i:04d}.bin"
        path.write_bytes(os.urandom(1000 + i))
        paths.append(str(path))
    os.sync()
    return paths


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    (tmp_path / "cache").mkdir()
    return tmp_path / "cache"


def evicted(paths: list[str]) -> list[str]:
    for path in paths:
        evict_file(path)
    return paths


class Reads(torch.utils.data.Dataset):
    """A user's own Dataset: each item opens its file and gives its bytes, whole."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        with open(self.paths[i], "rb") as f:
            return f.read()


def whole(paths: list[str]) -> list[bytes]:
    out = []
    for path in paths:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


def epoch(dl: torch.utils.data.DataLoader) -> list[bytes]:
    return [sample for batch in dl for sample in batch]


def ours(
    paths: list[str], cache_dir: Path, workers: int = 0, dataset: Reads | None = None
) -> loader.DataLoader:
    return loader.DataLoader(
        Reads(paths) if dataset is None else dataset,
        batch_size=BATCH,
        collate_fn=list,
        num_workers=workers,
        persistent_workers=workers > 0,
        cache_bytes=1 << 22,
        cache_dir=cache_dir,
        cache_files=os.path.dirname(paths[0]),
    )


def test_it_passes_after_a_run_of_resident_misses_and_serves_again_once_a_probe_finds_one_gone():
    aside = SteppingAside()
    for _ in range(PASS_AFTER - 1):
        aside.found(True)
        aside.found(None)  # a hit breaks no run
    assert not aside.passing
    aside.found(True)
    assert aside.passing
    assert [aside.skips() for _ in range(2 * PROBE_EVERY)] == ([True] * (PROBE_EVERY - 1) + [False]) * 2
    aside.found(False)
    assert not aside.passing
    for _ in range(PASS_AFTER - 1):
        aside.found(True)
    aside.found(False)  # a miss from storage starts the run again
    aside.found(True)
    assert not aside.passing


def test_a_probe_that_learns_nothing_leaves_the_probe_to_the_next_read():
    aside = SteppingAside()
    for _ in range(PASS_AFTER):
        aside.found(True)
    assert [aside.skips() for _ in range(PROBE_EVERY)] == [True] * (PROBE_EVERY - 1) + [False]
    assert aside.probe(None)  # a file not listed: still passing
    assert not aside.skips()  # the next read probes
    assert not aside.probe(False)  # no room asked for: gone from the page cache, so served again
    assert not aside.passing


def test_a_worker_learns_afresh():
    aside = SteppingAside()
    for _ in range(PASS_AFTER):
        aside.found(True)
    assert aside.passing
    assert not pickle.loads(pickle.dumps(aside)).passing


def test_without_workers_a_warm_tree_passes_to_the_real_open_and_serves_once_the_page_cache_loses_it(
    tree: list[str], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(stepping_aside, "PROBE_EVERY", 2)  # every other batch probes, every other read
    want = whole(tree)  # read once: a comparison after each epoch would warm the page cache again
    dl = ours(tree, cache_dir)
    opens = []
    monkeypatch.setattr(stepping_aside.SteppingAside, "replaces_open", counted(opens))
    assert epoch(dl) == want
    first = dl.stats()
    assert (first.misses, first.records_admitted, first.hits) == (PASS_AFTER, PASS_AFTER, 0)
    assert 0 < first.files_passed < FILES - PASS_AFTER  # counted in the batches loaded with open replaced
    assert opens.count(False) == opens.count(True) - PASS_AFTER // BATCH  # the rest, with Python's own
    assert epoch(dl) == want
    second = dl.stats()
    assert (second.misses, second.hits) == (PASS_AFTER, 0)  # nothing served

    evicted(tree)
    no_room(monkeypatch)  # what is not resident is lost, not new
    assert epoch(dl) == want
    assert epoch(dl) == want
    fourth = dl.stats()
    assert fourth.records_cached == fourth.records_admitted == FILES  # served from storage since a probe
    assert fourth.files_passed - second.files_passed < 2  # in a batch that probes: up to the first probe


def no_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on the memory the job may take has no room for the files in the page cache."""
    view = memory.MemoryView(headroom=0, limit=1 << 40, source="a test", kernel=0)
    monkeypatch.setattr(served_files, "memory_view", lambda: view)
    monkeypatch.setattr(stepping_aside, "ROOM_CHECK_S", 0.0)  # asked again at once


def test_a_cold_tree_with_room_in_the_page_cache_passes_after_a_run_of_misses_and_serves_once_room_is_gone(
    tree: list[str], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    want = whole(tree)
    dl = ours(evicted(tree), cache_dir)
    assert dl.cache_files.page_cache_room()  # a small tree on a machine of gigabytes
    assert epoch(dl) == want
    first = dl.stats()
    assert (first.misses, first.records_admitted, first.hits) == (PASS_AFTER, PASS_AFTER, 0)
    assert epoch(dl) == want
    assert (dl.stats().misses, dl.stats().hits) == (PASS_AFTER, 0)  # the page cache has the rest

    no_room(monkeypatch)
    monkeypatch.setattr(stepping_aside, "PROBE_EVERY", 2)
    assert epoch(evicted(tree) and dl) == want
    assert dl.stats().records_cached >= FILES - BATCH - 2  # served from storage since the first probe


def test_room_is_the_memory_spare_holding_the_files_room_share_times(
    tree: list[str], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    files = CachedFiles(os.path.dirname(tree[0]), 1 << 22, cache_dir)
    size = sum(os.path.getsize(p) for p in tree)
    view = memory.MemoryView(headroom=0, limit=1 << 40, source="a test", kernel=0)
    for spare, room in ((ROOM_SHARE * size - 1, False), (ROOM_SHARE * size, True)):
        fixed = dataclasses.replace(view, headroom=spare + reserve_bytes(view))
        monkeypatch.setattr(served_files, "memory_view", lambda fixed=fixed: fixed)
        assert files.page_cache_room() is room


class ReadsWithLabels(Reads):
    """Each item opens a label file of its own, not under ``cache_files``, after its listed file."""

    def __init__(self, paths: list[str], label: str) -> None:
        super().__init__(paths)
        self.label = label

    def __getitem__(self, i: int) -> bytes:
        raw = super().__getitem__(i)
        with open(self.label, "rb") as f:
            return raw + f.read()


def test_a_file_not_listed_opened_beside_each_listed_one_does_not_keep_the_probes_from_the_listed(
    tree: list[str], cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(stepping_aside, "PROBE_EVERY", 2)  # two opens an item, a probe every other read
    label = tmp_path / "label.txt"
    label.write_bytes(b"7")
    dl = ours(tree, cache_dir, dataset=ReadsWithLabels(tree, str(label)))
    want = [raw + b"7" for raw in whole(tree)]
    assert epoch(dl) == want
    assert epoch(dl) == want
    before = dl.stats().records_admitted
    assert before == PASS_AFTER  # passing since
    no_room(monkeypatch)
    assert epoch(evicted(tree) and dl) == want
    assert dl.stats().records_admitted >= FILES - BATCH - 2  # a listed file probed: served again


def test_a_probe_of_a_file_the_kernel_will_not_answer_for_asks_as_a_miss_does(
    tree: list[str], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    files = CachedFiles(os.path.dirname(tree[0]), 1 << 22, cache_dir)
    monkeypatch.setattr(pagecache, "cached_pages", lambda fd, offset, length: None)  # as for another user's
    monkeypatch.setattr(pagecache, "can_tell", lambda fd: False)  # file: neither cachestat nor mincore tells
    whole(tree[:2])
    assert files.resident(tree[0]) is True
    assert files.resident(evicted(tree[1:2])[0]) is False
    assert files.resident(os.path.dirname(tree[0]) + "/not-listed.bin") is None


def counted(calls: list[bool]):
    real = stepping_aside.SteppingAside.replaces_open

    def replaces_open(self: stepping_aside.SteppingAside) -> bool:
        calls.append(real(self))
        return calls[-1]

    return replaces_open


def test_a_cold_tree_without_room_in_the_page_cache_is_served_from_the_first_read(
    tree: list[str], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    no_room(monkeypatch)
    want = whole(tree)
    dl = ours(evicted(tree), cache_dir)
    assert epoch(dl) == want
    assert epoch(dl) == want
    stats = dl.stats()
    assert (stats.files_passed, stats.misses, stats.hits, stats.records_admitted) == (0, FILES, FILES, FILES)


@pytest.mark.filterwarnings(FORK_WARNING)
def test_each_worker_learns_from_its_own_reads(tree: list[str], cache_dir: Path):
    dl = ours(tree, cache_dir, workers=2)
    assert epoch(dl) == whole(tree)
    stats = dl.stats()
    assert stats.misses == stats.records_admitted == 2 * PASS_AFTER
    assert stats.files_passed == FILES - 2 * PASS_AFTER
    assert epoch(dl) == whole(tree)
    assert dl.stats().files_passed == 2 * FILES - 2 * PASS_AFTER


def test_a_restart_over_a_store_and_a_page_cache_that_both_hold_the_files_passes_after_probing_its_hits(
    tree: list[str], cache_dir: Path
):
    first = FileReads(CachedFiles(os.path.dirname(tree[0]), 1 << 22, cache_dir), StatsBoard(0))
    first.files.hold_admissions()
    for path in tree:  # a first run whose files were read while the page cache held them: all admitted
        first.files.read(path)
    assert first.files.admit_held() == FILES
    again = FileReads(CachedFiles(os.path.dirname(tree[0]), 1 << 22, cache_dir), StatsBoard(0))
    hits = PASS_AFTER * PROBE_EVERY
    assert [again.read(tree[i % FILES]) for i in range(hits)] == [whole(tree)[i % FILES] for i in range(hits)]
    assert again.aside.passing
    assert again.read(tree[0]) is None  # the real open reads it
    again.board.flush(storage=False)
    assert again.board.count("files_passed") == 1
