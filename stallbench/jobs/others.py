"""The loaders users would pick instead of ours, each on the data converted with its own tool.

The copies are written by their tools (``writers``), once (``converted``).

- **LitData** (``litdata.optimize`` writes chunks; ``litdata.StreamingDataset`` with ``shuffle=True`` and
  ``litdata.StreamingDataLoader`` read them), the loader Lightning's users pick for data in object storage;
- **WebDataset** (``webdataset.ShardWriter`` writes tar shards; ``webdataset.WebDataset`` shuffles the shard
  order and, within a buffer, the samples; torch's DataLoader splits the shards between its workers), the
  format of many public image and text corpora;
- **MosaicML Streaming** (``streaming.MDSWriter`` writes MDS shards; ``streaming.StreamingDataset`` with
  ``shuffle=True``, subclassed to shape its samples, in ``streaming.StreamingDataLoader``), imported as
  ``streaming_import`` says: its package imports torchvision, which does not import beside the torch these
  jobs run.

Each sample is the job's transform of the image's bytes and its label, as our dataset gives it; none of them
has a cache of its own for local data (each reads its files in place), so they read through the page cache,
as torch's loader does. For data in object storage each reads its copy in the bucket (``object_copies``):
LitData and Streaming download whole chunks or shards to local disk (their default settings, in a folder of
the run's own) and WebDataset streams each shard through curl every epoch. Their stage times are not timed
(they have no hook for it).
"""

from __future__ import annotations

import atexit
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterableDataset

from stallbench.conditions.storage import in_object_storage
from stallbench.jobs.converted import ConversionError, converted_copy, existing_copy
from stallbench.jobs.kinds import LITDATA, STREAMING, WEBDATASET
from stallbench.jobs.object_copies import presigned_urls
from stallbench.jobs.streaming_import import streaming
from stallbench.jobs.writers import WRITERS

if TYPE_CHECKING:
    from stallbench.jobs.spec import WorkloadJob

__all__ = ["build_litdata", "build_streaming", "build_webdataset", "check_installed", "convert"]

_PACKAGES = {STREAMING: "mosaicml-streaming"}  # where the package's name on PyPI is not the kind's
_SHUFFLE_BUFFER = 1_000  # samples WebDataset shuffles among (its documentation's example)


def convert(data: str, kind: str, made: str | None = None) -> str:
    """The copy of the image folder ``data`` that ``kind`` reads, written with its own tool where there is
    none yet (untimed: the parent converts before the runs); ConversionError where its library is missing.
    Data in object storage: ``made``, a local copy of it already in ``kind``'s format, is uploaded as it is
    (no second download, no second conversion)."""
    check_installed(kind)
    return converted_copy(data, kind, WRITERS[kind], made)


def check_installed(kind: str) -> None:
    """ConversionError where ``kind``'s library cannot be imported here, naming the package to install."""
    try:
        streaming() if kind == STREAMING else __import__(kind)
    except ImportError as err:
        package = _PACKAGES.get(kind, kind)
        raise ConversionError(
            f"--loaders {kind}: {kind} is not installed here (pip install {package})"
        ) from err


class _Sample:
    """A converted record -> (the job's transform of its image bytes, its label), as our dataset gives."""

    def __init__(self, transform: Callable[[bytes], Any] | None) -> None:
        self.transform = transform

    def __call__(self, image: bytes, label: Any) -> tuple[Any, int]:
        return (self.transform(image) if self.transform else image), int(label)

    def of_item(self, item: dict[str, Any]) -> tuple[Any, int]:
        return self(item["image"], item["label"])

    def of_pair(self, pair: tuple[bytes, bytes]) -> tuple[Any, int]:
        return self(*pair)


def build_litdata(dataset: Any, collate: Callable, job: WorkloadJob, **common: Any) -> Any:
    """LitData's loader over its copy of the job's image folder; ``dataset`` (ours) gives the transform."""
    import litdata

    copy = existing_copy(job.data, LITDATA)
    sample = _Sample(dataset.transform)
    where = {"cache_dir": _chunk_cache()} if in_object_storage(copy) else {}
    streaming = litdata.StreamingDataset(copy, shuffle=True, seed=job.seed, transform=sample.of_item, **where)
    return litdata.StreamingDataLoader(streaming, collate_fn=collate, **_loader_options(common))


def _chunk_cache() -> str:
    """A private folder for the chunks or shards a loader downloads from a copy in object storage, on disk
    where our caches live by default, removed when this process ends, or by a later run where it was killed
    (LitData's default, under the home folder, outlives the run: the next run's first epoch would read it,
    not the bucket). Its other cache settings stay at their defaults."""
    from stallbench.jobs.run import scratch_cache_dir

    folder = scratch_cache_dir()
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return str(folder)


def build_streaming(dataset: Any, collate: Callable, job: WorkloadJob, **common: Any) -> Any:
    """MosaicML Streaming's loader over its copy of the job's image folder: read in place where the copy is
    local, downloaded shard by shard into a folder of the run's own where it is in object storage (its other
    settings at their defaults: a shard kept once downloaded, no cache limit)."""
    from stallbench.jobs.streaming_samples import StreamingSamples

    copy = existing_copy(job.data, STREAMING)
    where = {"remote": copy, "local": _chunk_cache()} if in_object_storage(copy) else {"local": copy}
    options = dict(shuffle=True, shuffle_seed=job.seed, batch_size=job.batch_size, **where)
    samples = StreamingSamples(_Sample(dataset.transform).of_item, **options)
    return streaming().StreamingDataLoader(samples, collate_fn=collate, **_loader_options(common))


def build_webdataset(dataset: Any, collate: Callable, job: WorkloadJob, **common: Any) -> Any:
    """WebDataset's pipeline over its copy of the job's image folder, in torch's DataLoader."""
    import torch
    import webdataset

    shards = _shards(existing_copy(job.data, WEBDATASET))
    pipeline = (
        webdataset.WebDataset(shards, shardshuffle=len(shards), empty_check=False)  # a new order each epoch
        .shuffle(_SHUFFLE_BUFFER)
        .to_tuple("jpg", "cls")
        .map(_Sample(dataset.transform).of_pair)
    )
    pipeline = _Sized(pipeline, len(dataset))
    return torch.utils.data.DataLoader(pipeline, collate_fn=collate, **_loader_options(common))


def _shards(copy: str) -> list[str]:
    """WebDataset's shards: the files of a local copy, or URLs of a copy in object storage, which it reads
    through curl, as its documentation shows for HTTP (presigned: the bucket need not be public)."""
    if in_object_storage(copy):
        return presigned_urls(copy, ".tar")
    return sorted(str(p) for p in Path(copy).glob("shard-*.tar"))


class _Sized(IterableDataset):
    """WebDataset's pipeline with its epoch's length, so that ``len()`` of its loader says its batches (its
    own ``with_length`` makes a class that cannot be pickled into a worker)."""

    def __init__(self, pipeline: Any, samples: int) -> None:
        self.pipeline, self.samples = pipeline, samples

    def __iter__(self) -> Iterator[Any]:
        return iter(self.pipeline)

    def __len__(self) -> int:
        return self.samples


def _loader_options(common: dict[str, Any]) -> dict[str, Any]:
    """The job's DataLoader options for a loader that shuffles in its dataset (no sampler, no generator)."""
    return {k: v for k, v in common.items() if k not in ("shuffle", "generator")}
