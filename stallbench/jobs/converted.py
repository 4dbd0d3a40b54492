"""An image folder converted, once, into the format another loader reads: the folder beside the data (in
object storage, the location beside it in the bucket: ``object_copies``).

LitData, MosaicML Streaming and WebDataset (``stallbench.jobs.others``) read their own formats, written by
their own tools, so ``compare --loaders litdata,streaming,webdataset`` converts the data first, untimed, as
their users do. The copy goes beside the data, ``<data>.<kind>``, and must be on the data's filesystem, so the
storage condition (the page cache evicted, the kernel's read throttle on that device) holds for it as for the
data. A copy made from the same records is reused: ``stallbench-source.json`` in it holds the image folder's
fingerprint (every image's relative path and label, and each one's identity: its size and mtime). Only a copy
this user owns, a real folder that no one else may write, is trusted: a fingerprint is no secret, and a
planted copy could hold anything. A copy is written under a temporary name and renamed when whole; a stale one
is renamed aside before the new one takes its name, and removed after. A folder at that name that we did not
write is an error naming it, never removed.

Two analyses of one folder at once (a search's trials) convert it once: the copy is checked and written with
the data folder ``flock``ed, so the second finds the first's copy whole instead of writing its own and moving
the first's aside while the first's runs read it. The kernel frees the lock when its holder dies (that
holder's half-written copy is removed by the next); a holder that is stopped (SIGSTOP) is named in an error,
never waited for. The lock takes no file: nothing is left beside the data, and no name can be planted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

from stallbench.conditions.storage import in_object_storage
from stallbench.jobs.object_copies import converted_object_copy, object_copy, stamped

__all__ = ["ConversionError", "converted_copy", "existing_copy"]

STAMP = "stallbench-source.json"
Write = Callable[[str, Path], None]  # (the image folder, an empty folder) -> the copy written in it


class ConversionError(ValueError):
    """The data cannot be converted for a loader, or its copy cannot be read: the message names both."""


def _fingerprint(data: str | os.PathLike) -> str:
    import loader

    path = Path(data)
    if not path.is_dir() or (path / "data.mdb").exists() or (path / "state.json").exists():
        raise ConversionError(f"{path}: other loaders are compared on an image folder (class/image.jpg)")
    try:
        source = loader.ImageFolderSource(path)
    except (loader.SourceError, OSError) as err:
        raise ConversionError(f"{path}: {err}") from err
    identities = array("Q", map(source.identity, range(len(source))))  # a file rewritten in place too
    return hashlib.sha256(source.fingerprint.encode() + identities.tobytes()).hexdigest()


def _copy_path(data: str | os.PathLike, kind: str) -> Path:
    path = Path(data).resolve()
    return path.with_name(f"{path.name}.{kind}")


def _stamp(copy: Path) -> str | None:
    """The fingerprint a copy of ours holds; None for anything else at that name (or nothing)."""
    try:
        st = copy.lstat()
    except OSError:
        return None
    ours = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        return json.loads((copy / STAMP).read_text())["fingerprint"] if ours else None
    return None


def converted_copy(data: str | os.PathLike, kind: str, write: Write, made: str | None = None) -> str:
    """The copy of the image folder ``data`` for ``kind``: reused where its stamp matches the data, else
    written again by ``write``; ConversionError for data that is not an image folder, a folder at the
    copy's name that is not a copy of ours, a copy that would not be on the data's filesystem, or a
    conversion that fails (a folder that cannot be written, the tool's own error). Data in object storage
    gets its copy beside it in the bucket (``object_copies``): ``made``, a local copy in ``kind``'s format of
    the same objects, uploaded as it is, where there is one."""
    if in_object_storage(data):
        local = Path(made) if made is not None else None
        return _in_the_bucket(str(data), kind, lambda at: converted_object_copy(at, kind, write, local))
    fingerprint = _fingerprint(data)
    copy = _copy_path(data, kind)
    with _one_converter(Path(data)):
        return _converted_here(data, kind, copy, fingerprint, write)


def _converted_here(data: str | os.PathLike, kind: str, copy: Path, fingerprint: str, write: Write) -> str:
    """``converted_copy`` of a local folder into ``copy``, the folder's lock held."""
    _remove_dead_stagings(copy)
    found = _stamp(copy)
    if found == fingerprint:
        return str(copy)
    if found is None and (copy.exists() or copy.is_symlink()):
        raise ConversionError(f"{copy}: the {kind} copy of {data} goes here, and something else is there")
    if Path(data).resolve().stat().st_dev != copy.parent.stat().st_dev:
        raise ConversionError(
            f"{copy}: not on the filesystem of {data} (a mount point?): its reads would not be throttled"
        )
    try:
        _write_whole(data, copy, fingerprint, lambda folder: write(str(data), folder))
    except OSError as err:
        raise ConversionError(f"{copy}: the {kind} copy of {data} cannot be written: {err}") from err
    return str(copy)


def _in_the_bucket(url: str, kind: str, use: Callable[[object], str | None]) -> str | None:
    """``use`` of the image folder at ``url`` (loader's source of it); ConversionError naming the copy and
    the cause where the data cannot be listed, copied, converted or put back."""
    from boto3.exceptions import Boto3Error  # a failed upload (S3UploadFailedError)
    from botocore.exceptions import BotoCoreError, ClientError

    import loader

    failures = (loader.SourceError, loader.BadRecordError, ValueError, OSError, ClientError, BotoCoreError)
    try:
        return use(loader.ImageFolder(url, transform=None).source)
    except (*failures, Boto3Error) as err:
        raise ConversionError(f"{_where(url, kind)}: the {kind} copy of {url}: {err}") from err


_POLL_S = 0.1  # how often a second converter looks again at a folder another process is converting


@contextlib.contextmanager
def _one_converter(data: Path) -> Iterator[None]:
    """``data``'s folder locked against another process converting it; ConversionError where the process
    that holds it is stopped."""
    fd = os.open(data, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _flock_holder(os.fstat(fd))
                if holder is not None and _stopped(holder):
                    stopped = f"process {holder} is converting it and is stopped (SIGSTOP?)"
                    raise ConversionError(f"{data}: {stopped}: resume or end it") from None
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)  # and the lock with it


def _flock_holder(st: os.stat_result) -> int | None:
    """The process holding a ``flock`` on the file of ``st``, from ``/proc/locks`` (None: not found)."""
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == where:  # a waiter's line has "->"
                return int(fields[4])
    return None


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger); False where it is gone."""
    import psutil

    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _remove_dead_stagings(copy: Path) -> None:
    """Half-written copies of this user's converters killed while writing (the lock is held: none is live)."""
    for staging in copy.parent.glob(f".{copy.name}-*"):
        with contextlib.suppress(OSError):
            st = staging.lstat()
            if st.st_uid == os.geteuid() and stat.S_ISDIR(st.st_mode):
                shutil.rmtree(staging)


def _write_whole(
    data: str | os.PathLike, copy: Path, fingerprint: str, write: Callable[[Path], None]
) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{copy.name}-", dir=copy.parent))
    try:
        write(staging)
        (staging / STAMP).write_text(json.dumps({"fingerprint": fingerprint, "data": str(data)}))
        old = None
        if copy.exists():  # a stale copy of ours (the data changed since): aside first, removed after
            old = Path(tempfile.mkdtemp(prefix=f".{copy.name}-old-", dir=copy.parent))
            copy.rename(old / "copy")
        staging.rename(copy)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def existing_copy(data: str | os.PathLike, kind: str) -> str:
    """The ``kind`` copy of ``data`` a parent made before the job started (a folder, or a location in the
    bucket); ConversionError where there is none (the data was not converted, or changed since)."""
    if in_object_storage(data):
        copy = _in_the_bucket(str(data), kind, lambda source: stamped(source, kind))
    else:
        copy = _copy_path(data, kind)
        copy = str(copy) if _stamp(copy) == _fingerprint(data) else None
    if copy is None:
        raise ConversionError(
            f"{_where(data, kind)}: no {kind} copy of {data} that matches it (convert it first)"
        )
    return copy


def _where(data: str | os.PathLike, kind: str) -> str:
    """Where the ``kind`` copy of ``data`` goes, for an error: the data itself where no copy can go."""
    if not in_object_storage(data):
        return str(_copy_path(data, kind))
    try:
        return object_copy(str(data), kind)
    except ValueError:
        return str(data)
