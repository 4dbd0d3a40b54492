"""Shared fixtures: the loader's default cache folder moved to one of this test session's own, a private cache
folder in /dev/shm, a check that tests leave nothing in /dev/shm, no workers' memory growth carried from one
test to the next, an S3-compatible server (moto's) started and stopped on loopback, and ``stallbench demo``
run once for the tests that check it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

SHM = Path("/dev/shm")
REPO = Path(__file__).resolve().parents[1]
_WATCHED = ("stallbench-", "sbtest-", "torch_", "pym-")


def _shm_entries() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith(_WATCHED)} if SHM.is_dir() else set()


@pytest.fixture(scope="session", autouse=True)
def cache_home(tmp_path_factory):
    """Where a loader without ``cache_dir`` keeps its caches in this session (and in the processes its tests
    start): a folder of its own on disk, as ``/var/tmp`` is, so no test meets another run's stores there."""
    from loader.system.home import CACHE_DIR_VARIABLE

    home = tmp_path_factory.mktemp("cache-home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CACHE_DIR_VARIABLE, str(home))
        yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def shm_dir():
    """A fresh folder in /dev/shm for caches; removed after the test."""
    path = SHM / f"sbtest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fs_type(path) -> str:
    """The type of the filesystem holding ``path``, from the longest matching mount point."""
    path, best = os.path.realpath(path), ("", "")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, mount, fstype, *_ = line.split()
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best[0]):
                best = (mount, fstype)
    return best[1]


@pytest.fixture
def disk(tmp_path):
    if _fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip(
            f"{tmp_path} is on {_fs_type(tmp_path)}, which keeps every page in memory and ignores fadvise"
        )
    return tmp_path


@pytest.fixture(autouse=True)
def fresh_fork_growth(monkeypatch):
    """Each test starts with no workers' growth measured (``loader.system.forkgrowth``): a process's figure
    would carry the workers of earlier tests into its stores' room."""
    import loader.system.forkgrowth as forkgrowth

    monkeypatch.setattr(forkgrowth, "_most_per_worker", 0)
    monkeypatch.setattr(forkgrowth, "_last_fork", None)
    monkeypatch.setattr(forkgrowth, "_next_reading", 0.0)  # its first fork measured, as a process's is


_MAKER = re.compile(r"^(?:stallbench-run-|torch_|pym-)(\d+)[-_]")


def _others(name: str) -> bool:
    """Whether ``name`` was made by a live process that is not this session's own (another user's suite on
    the same machine): the process is named in it, and this one is not among its ancestors."""
    found = _MAKER.match(name)
    if found is None:
        return False
    try:
        return os.getpid() not in {p.pid for p in psutil.Process(int(found[1])).parents()}
    except psutil.Error:  # gone: nothing can tell whose it was; a leak of ours until shown otherwise
        return False


@pytest.fixture(autouse=True)
def no_shm_leak(request):
    """Fails a multi-process test that leaves shared memory behind (what other users' live processes make
    there meanwhile is theirs, not a leak)."""
    if request.node.get_closest_marker("multiproc") is None:
        yield
        return
    before = _shm_entries()
    yield
    leaked = {n for n in _shm_entries() - before if not n.startswith("sbtest-") and not _others(n)}
    assert not leaked, f"left in /dev/shm: {sorted(leaked)}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_moto(port: int, *tls: str) -> subprocess.Popen:
    """moto's S3 server on loopback; ``tls``: its certificate and key files (else plain HTTP)."""
    options = ["-c", tls[0], "-k", tls[1]] if tls else []
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.05)
    server.kill()
    raise RuntimeError("moto's S3 server did not start within 30 s")


@contextlib.contextmanager
def _s3_server(monkeypatch, scheme: str, *tls: str, **env: str) -> Iterator[subprocess.Popen]:
    port = _free_port()
    for name, value in {
        "AWS_ENDPOINT_URL": f"{scheme}://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        **env,
    }.items():
        monkeypatch.setenv(name, value)
    proc = _start_moto(port, *tls)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def s3_server(monkeypatch) -> Iterator[subprocess.Popen]:
    """A fresh S3 server on loopback, boto3 (and the processes a test starts) pointed at it through its own
    environment variables."""
    with _s3_server(monkeypatch, "http") as proc:
        yield proc


@pytest.fixture
def s3_tls_server(monkeypatch, tmp_path_factory) -> Iterator[subprocess.Popen]:
    """``s3_server`` over TLS, its certificate signed by an authority of the test's own, which boto3, curl
    and obstore are told to trust (``certificates.trusting``)."""
    from certificates import server_certificate, trusting

    ca, cert, key = server_certificate(tmp_path_factory.mktemp("tls"))
    with _s3_server(monkeypatch, "https", str(cert), str(key), **trusting(ca)) as proc:
        yield proc


DemoRun = tuple[Path, subprocess.CompletedProcess]


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Callable[..., DemoRun]:
    """``stallbench demo ARGS`` on 96 generated images, run once a session for each ARGS, in a folder of its
    own where it makes its images and writes ``demo.json`` and its plot: the README's ``stallbench demo``
    (``test_readme``) and the checks of what it prints and writes (``test_demo``) are one run. Returns (that
    folder, the finished process); ``subprocess.run`` kills the demo if it outlives its timeout."""
    runs: dict[tuple[str, ...], DemoRun] = {}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }

    def run(*args: str) -> DemoRun:
        if args not in runs:
            folder = tmp_path_factory.mktemp("demo")
            argv = [sys.executable, "-m", "stallbench", "demo", *args, "--num-images", "96"]
            argv += ["--data-dir", str(folder / "data"), "--json", "demo.json"]
            done = subprocess.run(argv, cwd=folder, env=env, text=True, capture_output=True, timeout=600)
            runs[args] = folder, done
        return runs[args]

    return run
