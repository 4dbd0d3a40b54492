"""``DataLoader(cache_files=...)``: a Dataset that opens its own files gets them through our cache, in the
main process and in forked, spawned, stopped and killed workers, and yields what torch's loader yields."""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data
from PIL import Image

import loader
from loader import DataLoader
from loader.cache import MinIOCache
from loader.serving.files import LARGEST_FILE
from loader.serving.open_hook import _real_open

FORK_WARNING = "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"
N, SIZE = 12, 3000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored(path: str | Path) -> bytes:
    with _real_open(path, "rb") as f:
        return f.read()


@pytest.fixture
def data(tmp_path):
    """N random files under ``data/raw``, a PNG, a .npy, a text file and a sparse file too big to serve."""
    root = tmp_path / "data"
    (root / "raw").mkdir(parents=True)
    for i in range(N):
        (root / "raw" / f"{i:02d}.bin").write_bytes(os.urandom(SIZE))
    Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3)).save(root / "img.png")
    np.save(root / "arr.npy", np.arange(10.0))
    (root / "notes.txt").write_bytes("épreuve\r\nline two\n".encode())
    with open(root / "big.npy", "wb") as f:
        f.truncate(LARGEST_FILE + 1)  # sparse: no time, no disk
    yield root
    assert builtins.open is io.open is _real_open  # nothing stays patched in the main process


def raw_paths(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "raw").iterdir())


class OpenReads(torch.utils.data.Dataset):
    """A user's own Dataset: opens each file itself. Sample: (the file class it got, the bytes' hash)."""

    def __init__(self, paths: list[str], kill_at: str | None = None) -> None:
        self.paths, self.kill_at = paths, kill_at

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[str, str]:
        if self.kill_at is not None and i == 5 and not os.path.exists(self.kill_at):
            Path(self.kill_at).touch()
            MinIOCache._write_all = _die  # this worker dies inside an admission, its slot reserved
        with open(self.paths[i], "rb") as f:
            return type(f).__name__, sha(f.read())


class Everything(torch.utils.data.Dataset):
    """Reads the way scripts do: PIL, numpy (whole and mapped), text, and opens that are not served."""

    def __init__(self, root: Path, elsewhere: Path) -> None:
        self.root, self.elsewhere = root, elsewhere

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> dict:
        root, path = self.root, raw_paths(self.root)[0]
        with Image.open(root / "img.png") as im:
            pil = (type(im.fp).__name__, np.asarray(im).tolist())
        texts = []
        for encoding in ("utf-8", "latin-1"):
            for newline in (None, ""):
                with open(root / "notes.txt", encoding=encoding, newline=newline) as f:
                    texts.append((type(f.buffer).__name__, f.read()))
        with open(path, "r+b") as rw, open(path, "rb", buffering=0) as unbuffered:
            raw_kinds = [type(rw).__name__, type(unbuffered).__name__]
        with open(self.elsewhere, "rb") as f, open(root / "big.npy", "rb") as big:
            raw_kinds += [type(f).__name__, type(big).__name__]
        return {
            "pil": pil,
            "npy": np.load(root / "arr.npy").tolist(),
            "mapped": np.load(str(root / "arr.npy"), mmap_mode="r").tolist(),
            "texts": texts,
            "not_served": raw_kinds,
            "pathlib": Path(path).read_bytes() == stored(path),
        }


def _die(*args: object) -> bool:
    os.kill(os.getpid(), signal.SIGKILL)
    return False


def _samples(batch: list) -> list:
    return batch


def epoch(dl) -> list:
    return [sample for batch in dl for sample in batch]


def expected(paths: list[str]) -> list[tuple[str, str]]:
    return [("ServedFile", sha(stored(p))) for p in paths]


def make(paths, root, shm_dir, **kw) -> DataLoader:
    kw = {"batch_size": 2, "collate_fn": _samples, "timeout": 120 if kw.get("num_workers") else 0, **kw}
    return DataLoader(OpenReads(paths), cache_bytes=1 << 20, cache_dir=shm_dir, cache_files=root, **kw)


def test_without_workers_the_reads_are_served_while_a_batch_loads(data, shm_dir):
    paths = raw_paths(data)
    dl = make(paths, data / "raw", shm_dir)
    assert epoch(dl) == expected(paths) and builtins.open is _real_open  # given back between batches
    assert epoch(dl) == expected(paths)
    stats = dl.stats()
    assert (stats.hits, stats.misses) == (N, N) and stats.records_cached == N == stats.records_admitted
    assert (stats.bytes_from_source, stats.bytes_from_cache) == (N * SIZE, N * SIZE)
    assert stats.cache_capacity == 1 << 20 and stats.fetch_seconds > 0 and stats.batches_collated == N
    assert dl.cache_files is not None and dl.cache is None


def test_the_samples_are_torchs_whole_values(data, shm_dir):
    paths = raw_paths(data)
    theirs = torch.utils.data.DataLoader(OpenReads(paths), batch_size=3, collate_fn=_samples)
    ours = make(paths, data, shm_dir, batch_size=3)
    want = [(kind, digest) for kind, digest in epoch(theirs)]
    for _ in range(2):
        got = epoch(ours)
        assert [d for _, d in got] == [d for _, d in want] and {k for k, _ in got} == {"ServedFile"}


def test_scripts_reads_are_served_and_every_other_open_goes_to_the_real_one(data, shm_dir, tmp_path):
    (tmp_path / "elsewhere.bin").write_bytes(b"x")
    real = Everything(data, tmp_path / "elsewhere.bin")[0]
    dl = DataLoader(
        Everything(data, tmp_path / "elsewhere.bin"),
        batch_size=None,
        cache_bytes=1 << 20,
        cache_dir=shm_dir,
        cache_files=data,
    )
    (served,) = list(dl)
    assert (
        served["pil"] == ["ServedFile", real["pil"][1]] and served["npy"] == served["mapped"] == real["npy"]
    )
    assert served["texts"] == [["ServedFile", text] for _, text in real["texts"]]  # lists: default_convert
    assert served["not_served"] == real["not_served"] == ["BufferedRandom", "FileIO"] + ["BufferedReader"] * 2
    assert served["pathlib"] is True
    stats = dl.stats()  # misses: the PNG, the .npy, the text file, raw/00.bin; the rest hits
    assert stats.misses == 4 and stats.hits == 2 + 3 + 1


def test_a_file_changed_since_the_listing_is_never_served_stale(data, shm_dir):
    paths = raw_paths(data)
    dl = make(paths, data / "raw", shm_dir)
    epoch(dl)
    Path(paths[0]).write_bytes(os.urandom(SIZE))  # same size, new mtime
    Path(paths[1]).write_bytes(os.urandom(SIZE + 5))  # new size
    os.utime(paths[0], ns=(1, 1))
    assert epoch(dl) == expected(paths)
    assert dl.stats().hits == N - 2


@pytest.mark.multiproc
@pytest.mark.filterwarnings(FORK_WARNING)
def test_forked_workers_serve_and_count_into_one_total_with_the_users_worker_init(data, shm_dir):
    paths, init = raw_paths(data), _check_served_init
    dl = make(
        paths, data / "raw", shm_dir, num_workers=2, multiprocessing_context="fork", worker_init_fn=init
    )
    assert epoch(dl) == expected(paths) and epoch(dl) == expected(paths)
    stats = dl.stats()
    assert (stats.hits, stats.misses) == (N, N) and stats.records_cached == N == stats.records_admitted
    assert dl.worker_init_fn is init  # the user's own, as set; it ran in each worker, after ours


def _check_served_init(worker_id: int) -> None:
    assert builtins.open.__module__ == "loader.serving.open_hook"  # served before the user's init runs


@pytest.mark.multiproc
def test_spawned_workers_attach_to_the_same_store(data, shm_dir):
    paths = raw_paths(data)
    dl = make(
        paths, data / "raw", shm_dir, num_workers=2, multiprocessing_context="spawn", persistent_workers=True
    )
    assert epoch(dl) == expected(paths) and epoch(dl) == expected(paths)
    assert (dl.stats().hits, dl.stats().misses) == (N, N)
    assert len(list(shm_dir.glob("stallbench-*/minio-*"))) == 1  # the workers attached; none made its own


@pytest.mark.multiproc
@pytest.mark.filterwarnings(FORK_WARNING)
def test_a_worker_killed_mid_admission_leaves_the_store_usable(data, shm_dir, tmp_path):
    paths = raw_paths(data)
    killed = DataLoader(
        OpenReads(paths, kill_at=str(tmp_path / "killed")),
        batch_size=2,
        num_workers=2,
        collate_fn=_samples,
        multiprocessing_context="fork",
        cache_bytes=1 << 20,
        cache_dir=shm_dir,
        cache_files=data / "raw",
    )
    with pytest.raises(RuntimeError, match=r"killed by signal|exited unexpectedly"):
        epoch(killed)
    dl = make(paths, data / "raw", shm_dir, num_workers=2)
    assert epoch(dl) == expected(paths)  # the dead writer's slot is taken over
    assert epoch(dl) == expected(paths) and dl.stats().records_cached == N


@pytest.mark.multiproc
@pytest.mark.filterwarnings(FORK_WARNING)
def test_a_stopped_worker_holds_nothing_once_it_goes_on(data, shm_dir):
    paths = raw_paths(data)
    dl = make(paths, data / "raw", shm_dir, num_workers=2, persistent_workers=True)
    epoch(dl)
    it = iter(dl)
    first = next(it)
    worker = dl._iterator._workers[0].pid
    os.kill(worker, signal.SIGSTOP)
    threading.Timer(2.0, os.kill, (worker, signal.SIGCONT)).start()
    start = time.monotonic()
    rest = [s for batch in it for s in batch]
    assert first + rest == expected(paths) and time.monotonic() - start < 60
    assert dl.stats().hits >= N


def test_a_restart_in_a_new_process_reads_from_the_store(data, shm_dir, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import sys, hashlib, torch\nimport loader\n"
        "class D(torch.utils.data.Dataset):\n"
        "    def __init__(s, p): s.p = p\n    def __len__(s): return len(s.p)\n"
        "    def __getitem__(s, i):\n"
        "        with open(s.p[i], 'rb') as f:\n            return hashlib.sha256(f.read()).hexdigest()\n"
        "if __name__ == '__main__':\n"
        "    paths = sys.argv[3:]\n"
        "    dl = loader.DataLoader(D(paths), batch_size=4, num_workers=2, collate_fn=list,\n"
        "                           cache_bytes=1 << 20, cache_dir=sys.argv[2], cache_files=sys.argv[1])\n"
        "    out = [x for b in dl for x in b]\n"
        "    print(dl.stats().hits, dl.stats().misses, ' '.join(out))\n"
    )
    paths = raw_paths(data)
    runs = [
        subprocess.run(
            [sys.executable, str(script), str(data / "raw"), str(shm_dir), *paths],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.split()
        for _ in range(2)
    ]
    digests = [sha(stored(p)) for p in paths]
    assert runs[0] == ["0", str(N), *digests] and runs[1] == [str(N), "0", *digests]
    assert len(list(shm_dir.glob("stallbench-*/minio-*"))) == 1  # the store the second run found


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "cache_files needs a cache: set cache_bytes"),
        ({"cache_bytes": 1 << 20, "coordinate": True}, "cannot serve a coordinated group"),
        ({"cache_bytes": 1 << 20, "cache_files": "/nonexistent/stallbench"}, "/nonexistent/stallbench"),
    ],
)
def test_bad_arguments_are_named(data, shm_dir, kwargs, message):
    kwargs = {"cache_files": data / "raw", **kwargs}
    with pytest.raises(ValueError, match=message):
        DataLoader(OpenReads(raw_paths(data)), batch_size=2, cache_dir=shm_dir, **kwargs)


def test_a_source_backed_dataset_is_told_to_use_cache_bytes_alone(data, shm_dir, tmp_path):
    images = tmp_path / "images" / "a"
    images.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(images / "0.jpg")
    dataset = loader.ImageFolder(tmp_path / "images")
    with pytest.raises(ValueError, match="ImageFolder is source-backed: cache_bytes alone"):
        DataLoader(dataset, cache_bytes=1 << 20, cache_dir=shm_dir, cache_files=tmp_path / "images")


def test_cache_bytes_alone_on_a_users_dataset_names_cache_files(data, shm_dir):
    with pytest.warns(UserWarning, match="OpenReads is not a source-backed dataset.*cache_files="):
        DataLoader(OpenReads(raw_paths(data)), cache_bytes=1 << 20, cache_dir=shm_dir)
