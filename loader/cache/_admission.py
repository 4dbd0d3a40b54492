"""Whether this process may admit records into a store now, and why not: the one place that turns admission
off or pauses it, and says so once.

A store is shared, but each process decides for itself: one whose lock wait timed out, whose memory runs
short, or that cannot use the store at all (removed or replaced under it) stops admitting and reads on from
storage; the others go on.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np

from loader.system.headroom import PressureGauge, reserve_bytes
from loader.system.memory import format_bytes

__all__ = ["ADMIT_PAUSE", "MEMORY_PAUSE", "AdmissionGate"]

ADMIT_PAUSE = 30.0  # after a lock timeout, this process admits nothing for this long
MEMORY_PAUSE = 5.0  # when memory is short, this process admits nothing for this long, then looks again


class AdmissionGate:
    """This process's switch for admitting into the store at ``path``; warnings name the store."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.off = False  # this process cannot use the store: it reads from storage for good
        self.memory_pauses = 0  # times this process paused admission because memory was short
        self._paused_until = 0.0
        self._gauge = PressureGauge()

    def open(self) -> bool:
        """Whether admission is neither off nor paused now."""
        return not self.off and time.monotonic() >= self._paused_until

    def memory_short(self, nbytes: int, used: np.ndarray) -> bool:
        """Whether admitting ``nbytes`` more would leave memory under its reserve; if so, pause and warn the
        first time, saying what the store holds (``used[0]`` bytes: the header's field, read only then)."""
        if not self._gauge.short(nbytes):
            return False
        now = time.monotonic()
        if now < self._paused_until:  # another read-ahead thread of this process paused it just now
            return True
        self._paused_until = now + MEMORY_PAUSE
        self.memory_pauses += 1
        if self.memory_pauses == 1:
            view = self._gauge.last
            warnings.warn(
                f"memory is short ({format_bytes(view.headroom)} free per {view.source}, "
                f"{format_bytes(reserve_bytes(view))} kept free): the cache at {self.path} stops admitting "
                f"records at {format_bytes(int(used[0]))} and training goes on reading from "
                f"storage; it looks again every {MEMORY_PAUSE:g} s",
                RuntimeWarning,
                stacklevel=3,
            )
        return True

    def pause_after_timeout(self, exc: Exception, timeout: float) -> None:
        """The store's lock was not had within ``timeout`` seconds: admit nothing for a while."""
        self._paused_until = time.monotonic() + ADMIT_PAUSE
        warnings.warn(
            f"{exc} ({timeout:g} s): this process admits no records for {ADMIT_PAUSE:g} s "
            "and reads them from storage",
            RuntimeWarning,
            stacklevel=3,
        )

    def turn_off(self, exc: Exception) -> None:
        """The store cannot be used in this process: read from storage from now on."""
        self.off = True
        warnings.warn(
            f"the cache at {self.path} cannot be used in this process ({exc}); it reads from storage",
            RuntimeWarning,
            stacklevel=3,
        )
