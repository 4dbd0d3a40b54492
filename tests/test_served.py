"""Serving a script's own ``open(path, "rb")`` through our cache: what is served, what is left alone, and the
counts of forked, spawned and killed DataLoader workers."""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import io
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data
from PIL import Image

from loader.cache import MinIOCache
from loader.cache._layout import index_bytes
from loader.files import LARGEST_FILE
from stallbench.jobs import served
from stallbench.jobs.served import SERVED_ENV, ServedFile, install, served_counts, uninstall
from stallbench.jobs.spec import JOB_ENV, JobSpec

FORK_WARNING = "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"
N, SIZE = 12, 3000
SITECUSTOMIZE = """\
from stallbench.jobs.served import install
from stallbench.jobs.spec import JobSpec

install(JobSpec.from_env())
"""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored(path: str) -> bytes:
    """The file's bytes from storage, by the real open (not counted)."""
    with served._real_open(path, "rb") as f:
        return f.read()


@pytest.fixture
def data(tmp_path):
    """N random files, a PNG and a .npy under ``data/``: their paths, in listing order."""
    root = tmp_path / "data"
    (root / "raw").mkdir(parents=True)
    for i in range(N):
        (root / "raw" / f"{i:02d}.bin").write_bytes(os.urandom(SIZE))
    Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3)).save(root / "img.png")
    np.save(root / "arr.npy", np.arange(10.0))
    with served._real_open(root / "big.npy", "wb") as f:
        f.truncate(LARGEST_FILE + 1)  # sparse: no time, no disk
    return root


@pytest.fixture
def spec(data, tmp_path, shm_dir, monkeypatch):
    """A spec serving ``data`` with room for every file; no install from an earlier test is inherited."""
    monkeypatch.delenv(SERVED_ENV, raising=False)
    yield JobSpec(
        out_dir=str(tmp_path), loader="cached", data=(str(data),), cache_bytes=1 << 20, cache_dir=str(shm_dir)
    )
    uninstall()
    assert builtins.open is io.open is served._real_open


def raw_paths(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "raw").iterdir())


def test_binary_reads_of_listed_files_are_served_from_the_cache(spec, data):
    assert install(spec) and install(spec)  # idempotent
    assert builtins.open is io.open is served._open
    paths = raw_paths(data)
    for _ in range(2):
        for p in paths:
            with open(p, "rb") as f:
                assert isinstance(f, ServedFile) and (f.name, f.mode) == (p, "rb")
                assert sha(f.read()) == sha(stored(p))
    assert served_counts() == (N, N)
    with open(Path(paths[0]), mode="rb", buffering=1 << 16) as f:
        assert f.name == paths[0] and f.peek(4)[:4] == f.read(4) == stored(paths[0])[:4]
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"x")
    assert Path(paths[1]).read_bytes() == served._installed.read(paths[1])  # pathlib goes through io.open


def test_pil_and_numpy_read_through_it(spec, data):
    install(spec)
    with Image.open(data / "img.png") as im:
        assert isinstance(im.fp, ServedFile)
        pixels = np.asarray(im)
    assert pixels.tolist() == np.arange(48, dtype=np.uint8).reshape(4, 4, 3).tolist()
    assert np.load(data / "arr.npy").tolist() == np.arange(10.0).tolist()
    assert np.load(str(data / "arr.npy"), mmap_mode="r").tolist() == np.arange(10.0).tolist()  # via fileno
    assert served_counts() == (3, 2)  # the mapped load opens it three times: hits


def test_text_reads_are_served_and_decoded_as_the_real_open_decodes(spec, data):
    text = data / "notes.txt"
    text.write_bytes("épreuve\r\nline two\n".encode())
    real = {}
    for encoding in ("utf-8", "latin-1"):
        for newline in (None, ""):
            with Path(text).open(encoding=encoding, newline=newline) as f:
                real[encoding, newline] = f.read()
    install(spec)
    for (encoding, newline), expected in real.items():
        with open(text, encoding=encoding, newline=newline) as f:
            assert isinstance(f.buffer, ServedFile) and f.mode == "r"
            assert f.read() == expected
    with open(text, encoding="ascii", errors="replace") as f:
        assert f.read() == "\ufffd\ufffdpreuve\nline two\n"
    assert served_counts() == (4, 1)


def test_every_other_open_goes_to_the_real_one(spec, data, tmp_path):
    install(spec)
    path = raw_paths(data)[0]
    (tmp_path / "elsewhere.bin").write_bytes(b"x")
    with open(path, "r+b") as f, open(path, "rb", buffering=0) as raw:
        assert isinstance(f, io.BufferedRandom) and isinstance(raw, io.FileIO)
    with open(tmp_path / "elsewhere.bin", "rb") as f:
        assert isinstance(f, io.BufferedReader)
    fd = os.open(path, os.O_RDONLY)
    with open(fd, "rb") as f:
        assert isinstance(f, io.BufferedReader)
    with open(data / "big.npy", "rb") as f:  # more than LARGEST_FILE: read as the script asks, not whole
        assert isinstance(f, io.BufferedReader)
    with pytest.raises(FileNotFoundError), open(data / "raw" / "missing.bin", "rb"):
        pass
    with pytest.raises(IsADirectoryError), open(data / "raw", "rb"):
        pass
    with open(data / "new.bin", "wb") as f:  # writes under the roots are the script's own
        f.write(b"new")
    with (
        pytest.raises(ValueError, match="binary mode doesn't take an encoding"),
        open(path, "rb", encoding="utf-8"),
    ):
        pass
    assert served_counts() == (0, 0)


def test_without_data_or_cache_bytes_it_does_nothing_and_says_so_once(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv(SERVED_ENV, raising=False)
    for spec in (
        JobSpec(out_dir=str(tmp_path), cache_bytes=1 << 20),
        JobSpec(str(tmp_path), data=(str(tmp_path),)),
    ):
        assert not install(spec) and not install(spec)
        assert builtins.open is served._real_open and served_counts() == (0, 0)
    said = capfd.readouterr().err.splitlines()
    assert said == [
        "stallbench: file reads are not served through the cache (no data roots)",
        "stallbench: file reads are not served through the cache (no cache_bytes)",
    ]


class OpenReads(torch.utils.data.Dataset):
    """A user's own Dataset: opens each file itself. Sample: (the file class it got, the bytes' hash)."""

    def __init__(self, paths: list[str], kill_at: str | None = None) -> None:
        self.paths, self.kill_at = paths, kill_at

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[str, str]:
        if self.kill_at is not None and i == 5 and not os.path.exists(self.kill_at):
            Path(self.kill_at).touch()
            MinIOCache._write = _die  # this worker dies inside an admission, its slot reserved
        with open(self.paths[i], "rb") as f:
            return type(f).__name__, sha(f.read())


def _die(*args: object) -> bool:
    os.kill(os.getpid(), signal.SIGKILL)
    return False


def _samples(batch: list) -> list:
    return batch


def epoch(paths: list[str], context: str, kill_at: str | None = None) -> list[tuple[str, str]]:
    loader = torch.utils.data.DataLoader(
        OpenReads(paths, kill_at),
        batch_size=2,
        num_workers=2,
        collate_fn=_samples,
        multiprocessing_context=context,
        timeout=120,
    )
    return [sample for batch in loader for sample in batch]


def expected(paths: list[str]) -> list[tuple[str, str]]:
    return [("ServedFile", sha(stored(p))) for p in paths]


@pytest.mark.multiproc
@pytest.mark.filterwarnings(FORK_WARNING)
def test_forked_workers_inherit_it_and_count_into_one_total(spec, data):
    install(spec)
    paths = raw_paths(data)
    assert epoch(paths, "fork") == expected(paths)
    assert epoch(paths, "fork") == expected(paths)
    assert served_counts() == (N, N)


@pytest.mark.multiproc
def test_spawned_workers_install_again_and_attach_to_the_same_cache(spec, data, tmp_path, monkeypatch):
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot" / "sitecustomize.py").write_text(SITECUSTOMIZE)  # the bootstrap, in every process
    path = [str(tmp_path / "boot"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    monkeypatch.setenv(JOB_ENV, str(spec.write(tmp_path / "job.json")))
    install(spec)
    paths = raw_paths(data)
    assert served_counts() == (0, 0)
    assert epoch(paths, "spawn") == expected(paths)
    assert served_counts() == (0, N)
    assert epoch(paths, "spawn") == expected(paths)
    assert served_counts() == (N, N)
    user = served._installed.folder.parent
    assert [p.name for p in user.glob("files-*")] == [served._installed.folder.name]  # none made its own


@pytest.mark.multiproc
@pytest.mark.filterwarnings(FORK_WARNING)
def test_a_worker_killed_mid_admission_leaves_the_store_usable(spec, data, tmp_path):
    install(spec)
    paths = raw_paths(data)
    with pytest.raises(RuntimeError, match=r"killed by signal|exited unexpectedly"):
        epoch(paths, "fork", kill_at=str(tmp_path / "killed"))
    hits, misses = served_counts()
    assert hits == 0 and 0 < misses < N
    assert epoch(paths, "fork") == expected(paths)  # the dead writer's slot is taken over
    assert epoch(paths, "fork") == expected(paths)
    cached = served._installed._caches[0].info().records_cached
    assert cached == N
    assert served_counts()[0] >= N
    folder = served._installed.folder
    uninstall()
    assert not folder.exists()


def test_a_spec_with_cache_bytes_too_small_for_the_index_is_refused(spec):
    small = dataclasses.replace(spec, cache_bytes=index_bytes(N + 2))
    with pytest.raises(ValueError, match="cannot hold even the index"):
        install(small)
    assert builtins.open is served._real_open
