"""Ready-made datasets over a Source: raw bytes from the cache or storage, then decode + augment. The cache
holds records raw or prepared (``loader.form.prepared``), never samples: random augmentation stays random each
epoch."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from torch.utils.data import Dataset

from loader import sources
from loader.cache import MinIOCache
from loader.errors import BadRecordError
from loader.fetching.decode import make_transform, tokens_to_tensor
from loader.fetching.fetched import SKIPPED, BatchCost, Fetched, fetch_raw, note_fetch
from loader.fetching.readahead import PROBE_MISSES, ReadAhead
from loader.form.prepared import PreparedRecords
from loader.partition.peers import PeerRecords
from loader.stats.board import StatsBoard

__all__ = ["SKIPPED", "ArrowDataset", "ImageFolder", "LMDBDataset", "SourceDataset", "TarShards"]

Transform = Literal["train", "eval"] | Callable[[bytes], Any] | None
OnError = Literal["raise", "skip"]


class SourceDataset(Dataset):
    """``dataset[i] -> (transform(raw_bytes_i), label_i)``; ``transform=None`` gives the raw bytes."""

    def __init__(self, source: sources.Source, transform: Transform = None) -> None:
        self.source = source
        self.transform = make_transform(transform)
        self._cache: MinIOCache | None = None
        self._board: StatsBoard | None = None
        self._on_error: OnError = "raise"
        self._readahead: ReadAhead | None = None
        self._peers: PeerRecords | None = None
        self._prepared: PreparedRecords | None = None
        self._spent = BatchCost()

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        index = self.source.check_index(index)
        return self._sample(index, lambda: self._fetch(index))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch (torch's fetcher calls this): read ahead on threads where that pays (see _readahead)."""
        readahead = self._readahead
        if readahead is None or not self.source.thread_safe_reads:
            return [self[i] for i in indices]
        samples = [] if readahead.wanted() else self._probed(readahead, indices)
        rest = indices[len(samples) :]
        if len(rest) and readahead.active:  # a batch sampler may yield an array or a tensor
            return samples + self._read_ahead(readahead, rest)
        return samples + [self[i] for i in rest]

    def _probed(self, readahead: ReadAhead, indices: Sequence[int]) -> list[Any]:
        """The batch's first records fetched one by one, until ``PROBE_MISSES`` of them missed our cache or
        the batch ends: what they took switches read-ahead for the rest of the batch. (A whole batch one by
        one cost 64 round trips in a row: 3.5 s a probe with 50 ms to object storage.)"""
        spent = self._spent = BatchCost()
        start = time.perf_counter()
        samples = []
        for index in indices:
            samples.append(self[index])
            if spent.misses >= PROBE_MISSES:
                break
        seconds = time.perf_counter() - start
        readahead.observe(spent.fetch_seconds, spent.decode_seconds, len(samples), spent.nbytes, seconds)
        return samples

    def _read_ahead(self, readahead: ReadAhead, indices: Sequence[int]) -> list[Any]:
        spent = self._spent = BatchCost()
        start = time.perf_counter()
        indices = [self.source.check_index(i) for i in indices]
        fetched = readahead.fetched(self._fetch, indices)
        samples = [self._sample(i, result) for i, result in zip(indices, fetched, strict=True)]
        seconds = time.perf_counter() - start
        readahead.read_ahead(len(indices), seconds, spent.misses, spent.miss_seconds, spent.miss_bytes)
        return samples

    def bind(
        self,
        *,
        cache: MinIOCache | None,
        board: StatsBoard,
        on_error: OnError,
        readahead: int = 0,
        peers: PeerRecords | None = None,
        prepared: PreparedRecords | None = None,
    ) -> SourceDataset:
        """A copy that reads through ``cache``, reports into ``board``, treats bad records per on_error,
        fetches ``readahead`` records at a time on threads (0: one by one, as torch does), and takes the
        records other nodes cache from ``peers`` (a partitioned cache), or holds them ``prepared``."""
        bound = copy.copy(self)
        bound._cache, bound._board, bound._on_error = cache, board, on_error
        bound._readahead = ReadAhead(readahead) if readahead else None
        bound._peers, bound._prepared = peers, prepared
        return bound

    def _sample(self, index: int, fetched: Callable[[], Fetched]) -> Any:
        try:
            got = fetched()
            self._note(got)
            sample = self._decode(index, got)
        except BadRecordError:
            if self._on_error == "raise":
                raise
            self._count("records_skipped", 1)
            return SKIPPED
        return sample, self.source.label(index)

    def read_record(self, index: int) -> tuple[bytes, bool]:
        """Record ``index``'s raw bytes through the cache (a miss admitted where there is room), and whether
        the cache had them; counted nowhere: a partitioned cache serves other nodes with it."""
        got = self._fetch(self.source.check_index(index))
        return got.raw, got.hit

    def _fetch(self, index: int) -> Fetched:
        """Thread-safe: reads and admits, counts nothing."""
        start = time.perf_counter()
        peers = self._peers
        if peers is not None and not peers.local(index):  # another node caches it: it sends it ahead
            raw = peers.take(index)
            if raw is not None:
                return Fetched(raw, False, False, time.perf_counter() - start, peer=True)
            return Fetched(self.source.read(index), False, False, time.perf_counter() - start)
        got = self._prepared.fetch(index, self.source.asked_identity) if self._prepared is not None else None
        if got is not None and got.hit:
            return got
        corrupt = got is not None  # a prepared copy that failed its check
        if self._cache is None:
            identity = self.source.identity(index) if self._prepared is not None else 0  # before the read
            raw = self.source.read(index)
            return Fetched(raw, False, False, time.perf_counter() - start, corrupt, identity=identity)
        return fetch_raw(self._cache, self.source, index, start, corrupt, self._held_prepared)

    def _held_prepared(self, index: int) -> bool:
        """Whether a miss will be held prepared (the prepared store has room), so not admitted raw as well."""
        return self._prepared is not None and self._prepared.store.accepting(index)

    def _note(self, got: Fetched) -> None:
        note_fetch(self._board.add if self._board is not None else None, self._spent, got)

    def _decode(self, index: int, got: Fetched) -> Any:
        if self.transform is None:
            return got.raw
        start = time.perf_counter()
        try:
            if self._prepared is None:
                sample = self.transform(got.raw)
            else:
                sample, admitted, way = self._prepared.make(index, got)
                self._count("records_admitted", admitted)
                self._count(way, 1)
        except (ValueError, OSError) as exc:
            raise BadRecordError(self.source.describe(index), index, str(exc)) from exc
        seconds = time.perf_counter() - start
        self._count("decode_seconds", seconds)
        self._spent.decode_seconds += seconds
        return sample

    def _count(self, field: str, amount: float) -> None:
        if self._board is not None:
            self._board.add(field, amount)


class ImageFolder(SourceDataset):
    """Images in the ImageNet layout ``root/<class>/<file>`` (or ``s3://bucket/prefix/<class>/<file>``)."""

    def __init__(self, root: str, transform: Transform = "train") -> None:
        super().__init__(sources.image_folder(root), transform)
        self.classes = self.source.classes


class TarShards(SourceDataset):
    """WebDataset tar shards (a folder of ``*.tar``, a shard or a list): a sample per key, read by offset."""

    def __init__(self, shards: Any, transform: Transform = "train") -> None:
        super().__init__(sources.TarShardsSource(shards), transform)


class LMDBDataset(SourceDataset):
    """Records of an LMDB environment in the layout of ``docs/sources.md`` (see ``image_folder_to_lmdb``)."""

    def __init__(self, path: str, transform: Transform = "train") -> None:
        super().__init__(sources.LMDBSource(path), transform)


class ArrowDataset(SourceDataset):
    """One column of an Arrow IPC or Parquet file, or of a Hugging Face dataset ``save_to_disk`` wrote (its
    ``label`` column by default): images (binary, ``Image``) or token sequences (lists of integers).

    With ``transform=None`` a token column gives int64 tensors and a binary column gives raw bytes."""

    def __init__(
        self,
        path: str,
        column: str | None = None,
        label_column: str | None = None,
        transform: Transform = None,
    ) -> None:
        source = sources.arrow_data(path, column=column, label_column=label_column)
        if transform is None and source.kind == "tokens":
            transform = tokens_to_tensor
        super().__init__(source, transform)
