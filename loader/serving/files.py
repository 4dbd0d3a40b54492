"""Files read by path through the MinIO cache: for a Dataset that opens its own files, not one of ours.

A user's Dataset names its records by path (``Image.open(path)``), so swapping in our DataLoader alone gives
it no cache. ``CachedFiles`` lists the files under some roots (one ``FileTreeSource`` and one store each) and
serves ``read(path)`` from the store, reading and admitting on a miss, just as ``SourceDataset`` does by
index. Each read stats the file: it is served only while its identity (size and mtime) is the one it had
when it was admitted, so a file rewritten since, even while the job runs, is read from storage, never
served stale. ``DataLoader(cache_files=...)`` serves a Dataset's own ``open``
through one (``loader.serving.open_hook``) and counts its reads in ``stats()``.
"""

from __future__ import annotations

import functools
import io
import os
import stat
import warnings
from collections.abc import Callable, Iterable
from typing import Literal, NamedTuple

from loader.cache import Admission, CacheInfo, MinIOCache
from loader.cache._layout import index_bytes
from loader.fetching.fetched import admitting, kept_out, served
from loader.serving.held_reads import Held, HeldReads
from loader.sources._file_records import file_identity
from loader.sources.file_tree import FileTreeSource, shared_listing
from loader.system.home import default_cache_dir
from loader.system.memory import memory_view
from loader.system.pagecache import evict_file, read_admitting, wholly_resident
from loader.system.sizing import reserve_bytes, sized_cache_bytes

__all__ = ["LARGEST_FILE", "CachedFiles", "FileRead"]

LARGEST_FILE = 64 << 20  # bigger files are not served: read whole, they would cost more than they save
_TOLD_UP_TO = 1 << 20  # a file no store takes is read telling its residency up to this size
ROOM_SHARE = 4  # the page cache has room for the files where the memory spare holds them this many times

PathArg = str | bytes | os.PathLike


class FileRead(NamedTuple):
    """A file's bytes as ``CachedFiles.read`` had them."""

    raw: bytes
    hit: bool  # from the store
    admitted: bool  # read from storage and stored by this read


class CachedFiles:
    """``read(path)``: the bytes of a file under ``roots``, through a shared store of ``cache_bytes`` in all.

    ``cache_bytes`` is split over the roots by their size (each store also holds its index); ``"auto"`` takes
    what memory the job may still use, up to the files' size (``cache_sizing`` says how). Files of more
    than ``largest`` bytes are not served (``read`` gives None): a caller may want only part of a big file
    (a shard, a memory-mapped array), and one that did not fit would close the store to all the rest.
    Picklable: a DataLoader worker, forked or spawned, reattaches the stores.
    """

    def __init__(
        self,
        roots: PathArg | Iterable[PathArg],
        cache_bytes: int | Literal["auto"],
        cache_dir: str | os.PathLike | None = None,
        *,
        largest: int = LARGEST_FILE,
    ) -> None:
        if isinstance(largest, bool) or not isinstance(largest, int) or not 0 < largest < 1 << 32:
            raise ValueError(f"largest must be a number of bytes from 1 to 2**32 - 1, got {largest!r}")
        self.largest = largest
        roots = [roots] if isinstance(roots, (str, bytes, os.PathLike)) else list(roots)
        if not roots:
            raise ValueError("roots must name at least one folder or file, got none")
        unique = list(dict.fromkeys(os.path.abspath(os.fsdecode(r)) for r in roots))
        _check_disjoint(unique)
        self.sources = [shared_listing(root) for root in unique]
        cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        capacities, self.cache_sizing = _capacities(self.sources, cache_bytes, cache_dir)
        warn = cache_bytes != "auto"
        pairs = zip(self.sources, capacities, strict=True)
        self._caches = [_open_store(source, capacity, cache_dir, warn) for source, capacity in pairs]
        self._held: HeldReads | None = None  # reads waiting for admission (hold_admissions)

    def read(self, path: PathArg, resident: Callable[[bool], None] | None = None) -> FileRead | None:
        """The file's bytes, whether the store had them and whether this read admitted them (a ``FileRead``);
        None when ``path`` is not a listed file under the
        roots, is gone, is no longer a regular file or has more than ``largest`` bytes. A path (relative:
        from the working folder) through links or with ``..`` is matched as the kernel would. Raises OSError
        when a listed file cannot be read. ``resident`` is told, of a file read from storage where the
        kernel says, whether every page of it was in the page cache before the read."""
        found = self._locate(path)
        if found is None:
            return None
        k, i, name = found
        try:
            st = os.stat(name)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size > self.largest:
            return None
        cache, identity = self._caches[k], file_identity(st)
        holding = self._held
        if (
            holding is not None
            and (h := holding.reads.get((k, i))) is not None
            and h.record.identity == identity
        ):
            return FileRead(h.record.payload, True, False)  # read before in this batch
        evict = functools.partial(evict_file, name)
        corrupt = False
        if cache is not None and cache.held_as(i, identity):
            raw, corrupt = served(cache, i, evict, None)
            if raw is not None and cache.held_as(i, identity):  # not given back and taken again meanwhile
                return FileRead(raw, True, False)
        return self._fetch(k, i, name, st, corrupt, evict, resident)

    def resident(self, path: PathArg) -> bool | None:
        """Whether every page of the listed file ``path`` is in the page cache now, asked as a miss asks
        (``pagecache.wholly_resident``); None for a path not listed under the roots, gone, empty, or on a
        filesystem that cannot tell."""
        found = self._locate(path)
        if found is None:
            return None
        try:
            fd = os.open(found[2], os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return wholly_resident(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def page_cache_room(self) -> bool:
        """Whether the memory the job may still take, less what it keeps free for its own growth, holds the
        files under the roots ``ROOM_SHARE`` times over: the page cache then keeps every file read, as it
        does for torch's loader, and the store would only hold them a second time
        (``loader.serving.stepping_aside``)."""
        view = memory_view()
        return view.headroom - reserve_bytes(view) >= ROOM_SHARE * sum(s.nbytes for s in self.sources)

    def hold_admissions(self) -> None:
        """Admit what is read from now on at ``admit_held``, together: one hold of each store's lock and a
        ``pwritev`` per run of records, where each read admitting at once takes the lock and writes, with
        the processor's caches cold from the decode between two reads (the digits job without workers,
        page cache warm: 5 us a file against 11). Up to ``_held_reads.HELD_BYTES``: past it, those held
        are admitted at once. Safe for a Dataset that reads from threads of its own meanwhile."""
        if self._held is None:
            self._held = HeldReads()

    def admit_held(self) -> int:
        """Admit the reads held since ``hold_admissions`` (and stop holding); how many were admitted since
        then. A read that brought its pages into the page cache and is not admitted (the store crowded) is
        evicted, as at once. Never raises: a store that cannot be written is turned off in this process."""
        holding, self._held = self._held, None
        return 0 if holding is None else holding.flush(self._admit)

    def _admit(self, reads: dict[tuple[int, int], Held]) -> int:
        admitted = 0
        for k, cache in enumerate(self._caches):
            mine = [h for (store, _), h in reads.items() if store == k]
            if cache is None or not mine:
                continue
            for h, ok in zip(mine, cache.admit_many([h.record for h in mine]), strict=True):
                admitted += ok
                if not ok and h.record.evict_on_hit and cache.crowded():
                    h.evict()
        return admitted

    def infos(self) -> list[CacheInfo]:
        """What each root's store holds now (none for a root whose store could not be made)."""
        return [cache.info() for cache in self._caches if cache is not None]

    def close(self) -> None:
        """Detach from the stores (they stay for the next run)."""
        for cache in self._caches:
            if cache is not None:
                cache.close()

    def _locate(self, path: PathArg) -> tuple[int, int, str] | None:
        """(root number, index, the path found): the path as written first (cheap; one absolute and
        normal already is taken as it is), then its real path (a stat per part). The path found is the
        one read: the listing's (``describe``) would be decoded and joined again for each read."""
        name = path if type(path) is str else os.fsdecode(path)
        if _normal_absolute(name):
            full = name
        else:
            full = os.path.realpath(name) if ".." in name.split(os.sep) else os.path.abspath(name)
        found = self._find(full)
        if found is None and (real := os.path.realpath(full)) != full:
            found = self._find(real)
        return found

    def _find(self, full: str) -> tuple[int, int, str] | None:
        for k, source in enumerate(self.sources):
            i = source.find(full)
            if i is not None:
                return k, i, full
        return None

    def _fetch(
        self,
        k: int,
        i: int,
        name: str,
        st: os.stat_result,
        corrupt: bool,
        evict: Callable[[], None],
        resident: Callable[[bool], None] | None,
    ) -> FileRead:
        """A file the store did not serve (``st``: its stat, taken before the read), read from storage and
        admitted while there is room (a slot held under another identity is taken again, in new space), or
        held for admission with the rest of the batch (``hold_admissions``)."""
        cache = self._caches[k]
        if cache is None or corrupt or not cache.accepting(i):
            if cache is not None and cache.crowded():  # its pages would push the store's out
                raw = read_admitting(name, kept_out(evict), lambda nbytes: True, resident)[0]
                return FileRead(raw, False, False)
            if resident is None or st.st_size > _TOLD_UP_TO:  # big: read once, as the real open would
                with io.FileIO(name) as f:
                    return FileRead(f.readall(), False, False)
            return FileRead(read_admitting(name, _admits_none, None, resident)[0], False, False)
        # admitted only at the size stat'ed: a file rewritten between our stat and our read is not stored
        identity = file_identity(st)
        holding = self._held
        if holding is None:
            admit, held = admitting(cache, i, evict, identity), 0
        else:
            admit, held = functools.partial(self._hold, k, i, identity, evict), holding.nbytes
        raw, admitted = read_admitting(
            name,
            lambda raw, ours: len(raw) == st.st_size and admit(raw, ours),
            lambda nbytes: nbytes == st.st_size and cache.takes(i, nbytes, held),
            resident,
        )
        return FileRead(raw, False, admitted)

    def _hold(self, k: int, i: int, identity: int, evict: Callable[[], None], raw: bytes, ours: bool) -> bool:
        """Hold a read for ``admit_held`` (a later read of the file in the batch is served from it); False:
        not admitted by this read."""
        holding = self._held
        if holding is not None and holding.hold((k, i), Held(Admission(i, raw, ours, identity), evict)):
            holding.flush(self._admit)
        return False


def _admits_none(raw: bytes, ours: bool) -> bool:
    """``read_admitting``'s ``admit`` for a file no store takes: its pages stay where the read left them."""
    return False


def _normal_absolute(name: str) -> bool:
    """Whether ``os.path.abspath(name)`` is ``name`` itself, told without its call (most paths a Dataset
    opens: a root joined with listed names); False may be wrong, never True."""
    sep = os.sep
    return name[:1] == sep and sep + "." not in name and sep + sep not in name and name[-1:] != sep


def _check_disjoint(roots: list[str]) -> None:
    for a in roots:
        for b in roots:
            if a != b and b.startswith(a.rstrip(os.sep) + os.sep):
                raise ValueError(f"root {b!r} lies inside root {a!r}: give one of them")


def _capacities(
    sources: list[FileTreeSource], cache_bytes: int | str, cache_dir: str | os.PathLike
) -> tuple[list[int | None], str]:
    """Each store's capacity (None: no store) and how the total was chosen (``sized_cache_bytes``)."""
    indexes = [index_bytes(len(s)) for s in sources]
    data = [s.nbytes for s in sources]
    if cache_bytes != "auto" and (
        isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes <= 0
    ):
        raise ValueError(f"cache_bytes must be a positive number of bytes or 'auto', got {cache_bytes!r}")
    asked = cache_bytes
    cache_bytes, sizing = sized_cache_bytes(asked, sum(indexes) + sum(data), cache_dir)
    spare = cache_bytes - sum(indexes)
    if spare <= 0 and sizing:
        warnings.warn(
            f"cache_bytes={asked!r} makes no cache ({sizing}); reading from storage", RuntimeWarning, 3
        )
        return [None] * len(sources), sizing
    if spare <= 0:
        raise ValueError(
            f"cache_bytes={cache_bytes} cannot hold even the index of the {sum(map(len, sources))} files "
            f"under the roots ({sum(indexes)} bytes); give it more"
        )
    weights = data if sum(data) else [1] * len(sources)
    return [ix + max(1, spare * w // sum(weights)) for ix, w in zip(indexes, weights, strict=True)], sizing


def _open_store(
    source: FileTreeSource, capacity: int | None, cache_dir: str | os.PathLike, warn: bool
) -> MinIOCache | None:
    if capacity is None:
        return None
    try:
        return MinIOCache.open(
            fingerprint=source.fingerprint,
            num_records=len(source),
            capacity=capacity,
            cache_dir=cache_dir,
            warn_capacity=warn,
        )
    except OSError as exc:  # /dev/shm full or not writable: read on from storage
        warnings.warn(f"the cache in {cache_dir} cannot be made ({exc}); reading from storage", stacklevel=3)
        return None
