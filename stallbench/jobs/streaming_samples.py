"""MosaicML Streaming's dataset, as its users shape its samples: a subclass whose ``__getitem__`` turns the
stored columns into a sample (its documentation's pattern), here the job's transform of the image bytes and
the label. Its own module: it imports Streaming (``streaming_import``) to subclass its dataset."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stallbench.jobs.streaming_import import streaming

__all__ = ["StreamingSamples"]


class StreamingSamples(streaming().StreamingDataset):
    """``StreamingDataset(**options)`` whose item ``i`` is ``sample(columns of i)``."""

    def __init__(self, sample: Callable[[dict[str, Any]], Any], **options: Any) -> None:
        super().__init__(**options)
        self.sample = sample

    def __getitem__(self, index: int) -> Any:
        return self.sample(super().__getitem__(index))
