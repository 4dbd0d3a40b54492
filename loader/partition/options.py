"""What ``partition_cache=`` accepts."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Partition", "partition_from"]


@dataclasses.dataclass(frozen=True)
class Partition:
    """A cache partitioned across the nodes of a ``torch.distributed`` job.

    timeout: seconds a worker waits for a record another node should send, and the exchange's gloo group
        waits on a peer, before reading from storage instead (that node is then taken as gone).
    ahead: records a rank keeps received and not yet used, per other node (None: enough for the loader's
        prefetch: (num_workers * prefetch_factor + 2) batches).
    """

    timeout: float = 30.0
    ahead: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or self.timeout <= 0:
            raise ValueError(f"Partition.timeout must be seconds (more than 0), got {self.timeout!r}")
        if self.ahead is not None and (
            isinstance(self.ahead, bool) or not isinstance(self.ahead, int) or self.ahead < 1
        ):
            raise ValueError(
                f"Partition.ahead must be a number of records (1 or more) or None, got {self.ahead!r}"
            )


def partition_from(value: Any) -> Partition | None:
    """``partition_cache=``: True (defaults), a Partition; False/None: off."""
    if value is None or value is False:
        return None
    if value is True:
        return Partition()
    if isinstance(value, Partition):
        return value
    raise ValueError(f"partition_cache must be True, False or a loader.Partition, got {value!r}")
