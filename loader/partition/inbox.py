"""A rank's inbox: records its node's peers sent ahead of need, one file each, for its workers to take.

The exchange thread of the rank's main process writes record ``i`` as ``p-<i>-<k>`` (``k``: the first
free number, as a batch may hold ``i`` twice), made whole under a temporary name and linked into place. A
worker that needs ``i`` takes any ``p-<i>-*`` by renaming it to a name of its own, so no two workers take
the same file. Each file is an xxh3-64 of the record then the record; a file that fails it is not used.
A peer found gone leaves ``gone-<node>``: workers stop waiting for its records and read them from storage.
The file ``split`` names the epoch's share of remote records read from storage instead (``split``).
The folder is private to this user and removed with the loader; its name holds the pid and start time of
the rank that made it, so that the next rank to start on the node removes the inbox of one that was killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from loader.partition.split import Split
from loader.system.private import open_private, replace_private, write_new

if TYPE_CHECKING:
    import psutil

__all__ = ["Inbox"]

_DIGEST = struct.Struct("<Q")
_SPLIT = struct.Struct("<qd")  # the epoch and its share of remote records read from storage
_MAX_COPIES = 8  # a record sent to one rank at most this many times before its worker takes it
_DAMAGED = object()


class Inbox:
    """The folder at ``path``; ``Inbox.make(parent, rank)`` creates a fresh one."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, parent: Path, rank: int) -> Inbox:
        """A fresh inbox in ``parent``, after removing those there whose rank's process is gone."""
        for entry in parent.glob("peers-r*-p*-s*-*"):
            if not _maker_alive(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
        import psutil  # here, not at the top: only a partitioned job needs it (0.8 MiB in every process)

        me = psutil.Process()
        prefix = f"peers-r{rank}-p{me.pid}-s{_started(me)}-"
        return cls(Path(tempfile.mkdtemp(prefix=prefix, dir=parent)))

    def put(self, index: int, record: bytes | memoryview) -> None:
        """Stage ``record`` for a worker (called by the exchange thread)."""
        tmp = self.path / f".t-{index}-{os.getpid()}"
        write_new(tmp, [_DIGEST.pack(xxhash.xxh3_64_intdigest(record)), record])
        try:
            for k in range(_MAX_COPIES):
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, self.path / f"p-{index}-{k}")
                    return
        finally:
            os.unlink(tmp)

    def take(self, index: int, owner: int, timeout: float) -> bytes | None:
        """Record ``index`` once it is here; None when its node is gone, ``timeout`` seconds pass, or the
        file fails its check (the caller reads the record from storage)."""
        deadline, pause = time.monotonic() + timeout, 0.0002
        while True:
            record = self._take_now(index)
            if record is _DAMAGED:
                return None
            if record is not None:
                return record
            if self.gone(owner) or time.monotonic() > deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    def _take_now(self, index: int) -> bytes | object | None:
        mine = f".w-{os.getpid()}-{index}"
        for k in range(_MAX_COPIES):
            try:
                os.rename(self.path / f"p-{index}-{k}", self.path / mine)
            except FileNotFoundError:
                continue
            fd = open_private(self.path, mine, os.O_RDONLY)
            try:  # the digest, then the record into a bytes object of its own size: no copy after
                digest, record = os.read(fd, _DIGEST.size), _read_rest(fd)
            finally:
                os.close(fd)
            os.unlink(self.path / mine)
            if len(digest) == _DIGEST.size and _DIGEST.unpack(digest)[0] == xxhash.xxh3_64_intdigest(record):
                return record
            return _DAMAGED
        return None

    def waiting(self) -> int:
        """Records staged and not yet taken."""
        with os.scandir(self.path) as entries:
            return sum(1 for e in entries if e.name.startswith("p-"))

    def clear(self) -> None:
        """Remove the records staged and not taken."""
        with os.scandir(self.path) as entries:
            for entry in entries:
                if entry.name.startswith("p-"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    def set_split(self, split: Split) -> None:
        """Publish the next epoch's split for the workers (before they start it): written whole, then
        renamed into place, so a worker reads the old split or the new one."""
        replace_private(self.path, "split", [_SPLIT.pack(split.epoch, split.share)])

    def split(self, known: tuple[int, Split]) -> tuple[int, Split]:
        """The split published now, with its file's inode: ``known`` (an inode and its split) again where the
        file is the same, so a worker reads it once per epoch."""
        try:
            inode = os.stat(self.path / "split").st_ino
        except FileNotFoundError:
            return 0, Split()
        if inode == known[0]:
            return known
        fd = open_private(self.path, "split", os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
        return (inode, Split(*_SPLIT.unpack(raw))) if len(raw) == _SPLIT.size else (0, Split())

    def mark_gone(self, node: int) -> None:
        (self.path / f"gone-{node}").touch(mode=0o600)

    def gone(self, node: int) -> bool:
        return os.path.lexists(self.path / f"gone-{node}")

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _read_rest(fd: int) -> bytes:
    """The rest of the file ``fd`` from its offset, read whole."""
    size = os.fstat(fd).st_size - os.lseek(fd, 0, os.SEEK_CUR)
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # none: an empty record, or a truncated file


def _started(process: psutil.Process) -> int:
    return round(process.create_time() * 100)


def _maker_alive(name: str) -> bool:
    """Whether the process named in an inbox's name (``peers-r<rank>-p<pid>-s<start>-...``) still runs: the
    pid alone could be another process's by now."""
    match = re.match(r"peers-r\d+-p(\d+)-s(\d+)-", name)
    if match is None:
        return True  # not ours to judge
    import psutil

    try:
        return _started(psutil.Process(int(match[1]))) == int(match[2])
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True
