"""How busy the rest of the machine was while a run ran: a run on a shared machine measures the other work
too, and a report must say so rather than pass it off as the job's.

The machine's busy CPU seconds (``psutil.cpu_times``: user, nice, system, irq, softirq, steal, as
``/proc/stat`` counts them), less this process's and its children's once reaped (``os.times``: the run's
command, and through it every worker and rank it waited for), over the run's wall time: the cores other work
kept busy.
"""

from __future__ import annotations

import os
import time
from types import TracebackType

import psutil

__all__ = ["BUSY_SHARE", "OtherLoad", "is_busy"]

BUSY_SHARE = 0.1  # other work on more than this share of the machine's cores: the run's figures include it


class OtherLoad:
    """``with OtherLoad() as load: ...``; then ``load.cores``: the cores other work kept busy on average."""

    def __init__(self) -> None:
        self.cores = 0.0
        self._start: tuple[float, float, float] | None = None

    def __enter__(self) -> OtherLoad:
        self._start = _now()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._start is None:
            return
        wall, busy, ours = (end - start for end, start in zip(_now(), self._start, strict=True))
        self.cores = max(0.0, (busy - ours) / wall) if wall > 0 else 0.0


def is_busy(other_cores: float, cores: int) -> bool:
    """Whether other work took more than ``BUSY_SHARE`` of the machine's ``cores``."""
    return other_cores > BUSY_SHARE * max(cores, 1)


def _now() -> tuple[float, float, float]:
    """Wall seconds, the machine's busy CPU seconds, this process's and its reaped children's."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + sum(getattr(t, k, 0.0) for k in ("irq", "softirq", "steal"))
    own = os.times()
    return time.monotonic(), busy, own.user + own.system + own.children_user + own.children_system
