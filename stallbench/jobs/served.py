"""The user's own file reads served through our cache, for ``stallbench compare``'s run with our loader.

A script's Dataset usually opens its files itself (``PIL.Image.open(path)``, ``np.load(path)``,
``open(path, "rb")``), so changing its DataLoader class alone caches nothing. ``install`` builds a
:class:`loader.files.CachedFiles` over the job's data roots and patches ``builtins.open`` and ``io.open`` (one
function) in this process: a plain binary read of a listed file returns a :class:`ServedFile` holding the
file's bytes from the cache; every other open goes to the real one untouched. Forked workers inherit the
patch. A spawned worker (or a torchrun rank) runs the bootstrap, hence ``install``, again: it attaches to the
first process's ``CachedFiles``, published in its private folder and named in ``STALLBENCH_SERVED``, so it
neither lists the tree again nor counts apart.

A read in text mode (``open(path)``, ``open(path, "r", encoding=...)``) is served too, decoded as the real
open would decode it.

Not served (they read from storage as before, uncounted): ``os.open``/``os.read``, ``io.FileIO`` and
``open(..., buffering=0)`` (raw files), read-write modes, files of more than
``loader.files.LARGEST_FILE`` bytes, ``mmap`` of a file (``ServedFile.fileno`` opens the real one), modules
that took ``open`` before the patch (``tarfile``), and C code that opens paths itself (OpenCV,
torchvision.io, h5py, Arrow).
"""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import pickle
import sys
import threading
from pathlib import Path
from typing import Any

from loader import CachedFiles
from loader.system import open_private
from stallbench.jobs._served_file import ServedFile, served_text
from stallbench.jobs.spec import JobSpec

__all__ = ["SERVED_ENV", "ServedFile", "install", "served_counts", "uninstall"]

SERVED_ENV = "STALLBENCH_SERVED"  # "<spec key> <published CachedFiles>", or "<spec key> off"
_installed: CachedFiles | None = None
_real_open: Any = builtins.open  # what the patch passes every other open to (set again by install)
_busy = threading.local()  # inside our own read: its opens go to the real open


def install(spec: JobSpec) -> bool:
    """Serve plain binary reads of the files under ``spec.data`` through a cache of ``spec.cache_bytes`` in
    ``spec.cache_dir``; True when this process serves them. Idempotent: a second call does nothing.

    Without data roots or cache_bytes it does nothing and says so once on stderr (children stay quiet).
    Raises ValueError naming a root that is missing or holds no files.
    """
    global _installed, _real_open
    if _installed is not None:
        return True
    key = _key(spec)
    if not spec.data or spec.cache_bytes is None:
        if os.environ.get(SERVED_ENV) != f"{key} off":
            missing = "no data roots" if not spec.data else "no cache_bytes"
            print(f"stallbench: file reads are not served through the cache ({missing})", file=sys.stderr)
            os.environ[SERVED_ENV] = f"{key} off"
        return False
    _installed = _shared(spec, key)
    if builtins.open is not _open:
        _real_open = builtins.open
    builtins.open = io.open = _open
    return True


def served_counts() -> tuple[int, int]:
    """(hits, misses) of served reads so far, over every process that shares this run's cache."""
    return _installed.counts() if _installed is not None else (0, 0)


def uninstall() -> None:
    """Give back the real open; the process that made the cache's counts also removes them."""
    global _installed
    if builtins.open is _open:
        builtins.open = _real_open
    if io.open is _open:
        io.open = _real_open
    if _installed is not None:
        if os.environ.get(SERVED_ENV, "").endswith(str(_installed.folder / "files.pickle")):
            del os.environ[SERVED_ENV]
        _installed.close()
        _installed = None


def _open(
    file: Any,
    mode: str = "r",
    buffering: int = -1,
    encoding: str | None = None,
    errors: str | None = None,
    newline: str | None = None,
    closefd: bool = True,
    opener: Any = None,
) -> Any:
    """``open``, serving a plain read of a listed file, binary or text; anything else goes to the real one."""
    binary = mode in ("rb", "br")
    if (
        (binary or mode in ("r", "rt", "tr"))
        and (buffering == -1 or buffering > 1)
        and opener is None
        and closefd is True
        and isinstance(file, (str, bytes, os.PathLike))
        and _installed is not None
        and not getattr(_busy, "reading", False)
        and (not binary or encoding is errors is newline is None)
    ):
        raw = _serve(_installed, file)
        if raw is not None:
            served = ServedFile(raw, os.fspath(file), "rb")
            return served if binary else served_text(served, mode, encoding, errors, newline)
    return _real_open(file, mode, buffering, encoding, errors, newline, closefd, opener)


def _serve(files: CachedFiles, file: str | bytes | os.PathLike) -> bytes | None:
    """The file's bytes, or None where the real open should answer (not ours, gone, unreadable)."""
    _busy.reading = True
    try:
        return files.read(file)
    except (OSError, ValueError, TypeError):  # the real open raises what the script expects
        return None
    finally:
        _busy.reading = False


def _shared(spec: JobSpec, key: str) -> CachedFiles:
    """The CachedFiles an ancestor published for this same spec, else a new one, published."""
    named, _, where = os.environ.get(SERVED_ENV, "").partition(" ")
    if named == key and where not in ("", "off"):
        try:
            return _attach(Path(where))
        except (OSError, ValueError, EOFError, pickle.UnpicklingError):
            pass  # its maker is gone: make our own
    files = CachedFiles(spec.data, spec.cache_bytes, spec.cache_dir or "/dev/shm")
    os.environ[SERVED_ENV] = f"{key} {_publish(files)}"
    return files


def _publish(files: CachedFiles) -> Path:
    """Pickle ``files`` into its private folder, whole or not at all (written aside, then renamed)."""
    path = files.folder / "files.pickle"
    aside = files.folder / f".files.pickle.{os.getpid()}"
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(files, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.rename(aside, path)
    return path


def _attach(path: Path) -> CachedFiles:
    """What ``_publish`` wrote; only from this user's own private file (it is unpickled)."""
    with io.FileIO(open_private(path.parent, path.name, os.O_RDONLY), "r") as f:
        files = pickle.loads(f.readall())
    if not isinstance(files, CachedFiles):
        raise ValueError(f"{path} does not hold a CachedFiles")
    return files


def _key(spec: JobSpec) -> str:
    """What makes two processes' specs serve the same way: roots, size and folder of the cache."""
    parts = (tuple(os.path.abspath(d) for d in spec.data), spec.cache_bytes, spec.cache_dir)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
