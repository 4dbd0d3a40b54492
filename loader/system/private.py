"""Folders and files only this user can touch: made with O_EXCL, checked on every open, never followed.

``/dev/shm`` and ``/tmp`` are world-writable: another user can create, ahead of us, the very name our store
would take. So the store lives in a per-user folder that is made 0700 or, if it exists, is used only when it
is a real folder (not a link) owned by us that no one else may enter; every file in it is opened with
``O_NOFOLLOW`` and checked the same way. Where another user took the per-user name first, the next free
name is ours (``user_dir``): a planted name never stops a job.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import uuid
import warnings
from pathlib import Path

__all__ = [
    "UntrustedCacheError",
    "check_private",
    "open_private",
    "private_dir",
    "replace_private",
    "user_dir",
    "write_new",
]

_FOREIGN_BITS = 0o077  # any access for group or others
_NAMES = 16  # per-user names tried before giving up: stallbench-<uid>, then stallbench-<uid>-1 ...
_said: set[Path] = set()  # the folders this process has said it uses instead of a planted one


class UntrustedCacheError(PermissionError):
    """A cache folder or file that someone else owns or may change: never attached to."""


def private_dir(parent: Path, name: str) -> Path:
    """``parent/name`` as a folder private to this user: made 0700 if absent, else checked."""
    _check_parent(parent)
    path = parent / name
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    check_private(os.lstat(path), path, want=stat.S_IFDIR)
    return path


def user_dir(parent: Path, option: str, base: str | None = None) -> Path:
    """This user's private folder ``base`` (default ``stallbench-<uid>``) in ``parent``, or, where another
    user made that name first, the first of ``base-1``, ``base-2`` ... that is ours or free. Every process of
    every job of this user tries the names in the same order, so they all find the same folder and still
    share; the first use in a process says so once, naming the planted folder and ``option``, the setting
    that moves ``parent``. Our own folder opened to others is refused (UntrustedCacheError), not passed
    over."""
    base = base or f"stallbench-{os.geteuid()}"
    for n in range(_NAMES):
        name = f"{base}-{n}" if n else base
        try:
            path = private_dir(parent, name)
        except UntrustedCacheError:
            if _ours(parent / name):
                raise
            continue
        if n and path not in _said:
            _said.add(path)
            warnings.warn(
                f"{parent / base} was made by another user ({_owner(os.lstat(parent / base).st_uid)}), not "
                f"you: this job uses {path} instead; to use a folder of your own, set {option}",
                RuntimeWarning,
                stacklevel=3,
            )
        return path
    raise UntrustedCacheError(
        f"{parent / base} and the next {_NAMES - 1} names after it were made by other users: set {option} "
        "to a folder of your own"
    )


def _ours(path: Path) -> bool:
    """Whether ``path`` is this user's (so a fault in it is ours to hear about, not a name to pass over)."""
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except FileNotFoundError:
        return True


def open_private(folder: Path, name: str, flags: int) -> int:
    """An fd of the file ``folder/name`` (which must be ours, private, and not a link); caller closes it."""
    path = folder / name
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise UntrustedCacheError(f"the cache file {path} cannot be opened safely: {exc.strerror}") from exc
    try:
        check_private(os.fstat(fd), path, want=stat.S_IFREG)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_new(path: Path, parts: list[bytes | memoryview]) -> None:
    """A new private file at ``path`` (none there, no link followed) holding ``parts`` whole: one call where
    the kernel takes it all (a tmpfs does)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        left = sum(len(p) for p in parts)
        done = os.writev(fd, parts)
        if done < left:
            joined = b"".join(parts)
            while done < left:
                done += os.write(fd, joined[done:])
    finally:
        os.close(fd)


def replace_private(folder: Path, name: str, parts: list[bytes | memoryview]) -> None:
    """``folder/name`` made, or replaced, whole at once (a reader sees the old file or the new one): written
    under a name of this process's own, then renamed over it. What a killed writer of ``name`` left behind
    is removed first."""
    for entry in os.scandir(folder):
        writer = entry.name.removeprefix(f".{name}.").split(".")[0]
        if entry.name.startswith(f".{name}.") and writer.isdigit() and not _running(int(writer)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    temporary = folder / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        write_new(temporary, parts)
        os.replace(temporary, folder / name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts: it cannot be ours to sweep after)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def check_private(st: os.stat_result, path: Path, *, want: int) -> None:
    """Raise UntrustedCacheError, naming ``path`` and its owner, unless it is ours, private and a ``want``."""
    kind = "folder" if want == stat.S_IFDIR else "file"
    if stat.S_IFMT(st.st_mode) != want:
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else f"not a {kind}"
        raise UntrustedCacheError(f"the cache {kind} {path} is {what} (owner {_owner(st.st_uid)}); not used")
    if st.st_uid != os.geteuid():
        raise UntrustedCacheError(
            f"the cache {kind} {path} belongs to {_owner(st.st_uid)}, not to you "
            f"({_owner(os.geteuid())}); not used"
        )
    if st.st_mode & _FOREIGN_BITS:
        raise UntrustedCacheError(
            f"the cache {kind} {path} (owner {_owner(st.st_uid)}) has mode {stat.S_IMODE(st.st_mode):04o}: "
            "others may change it; not used (it must be 0700 for a folder, 0600 for a file)"
        )


def _check_parent(parent: Path) -> None:
    """A folder others may write into must be sticky (as /dev/shm and /tmp are): else they could swap our
    folder for a link between our check and our use of it."""
    st = os.stat(parent)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UntrustedCacheError(
            f"cache_dir {parent} is writable by every user and not sticky (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): another user could replace the cache in it; choose another"
        )


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
