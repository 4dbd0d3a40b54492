"""Whether this process may admit records into a store now, and why not: the one place that turns admission
off or pauses it, or asks the store to give memory back, and says so once.

A store is shared, but each process decides for itself: one whose lock wait timed out, whose memory runs
short, or that cannot use the store at all (removed or replaced under it) stops admitting and reads on from
storage; the others go on.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from loader.system.headroom import PressureGauge
from loader.system.memory import format_bytes

__all__ = ["ADMIT_PAUSE", "MEMORY_PAUSE", "AdmissionGate"]

ADMIT_PAUSE = 30.0  # after a lock timeout, this process admits nothing for this long
MEMORY_PAUSE = 5.0  # when memory is short, this process admits nothing for this long, then looks again


class AdmissionGate:
    """This process's switch for admitting into the store at ``path``; warnings name the store.
    ``in_memory``: the store's pages are memory the kernel cannot take back (a tmpfs), not page cache."""

    def __init__(self, path: Path, in_memory: bool = True) -> None:
        self.path = path
        self.off = False  # this process cannot use the store: it reads from storage for good
        self.memory_pauses = 0  # times this process paused admission because memory was short
        self.given_back = 0  # bytes this process's store gave back: the job grew into the reserve
        self._paused_until = 0.0
        self._gauge = PressureGauge(held_in_memory=in_memory)
        self._crowded, self._crowded_at = False, float("nan")  # the answer, and the look it was made at

    def open(self) -> bool:
        """Whether admission is neither off nor paused now."""
        return not self.off and time.monotonic() >= self._paused_until

    def memory_short(self, nbytes: int, used: np.ndarray) -> bool:
        """Whether admitting ``nbytes`` more would leave memory under its reserve; if so, pause and warn the
        first time, saying what the store holds (``used[0]`` bytes: the header's field, read only then)."""
        if not self._gauge.short(nbytes, lambda: int(used[0])):
            return False
        now = time.monotonic()
        if now < self._paused_until:  # another read-ahead thread of this process paused it just now
            return True
        self._paused_until = now + MEMORY_PAUSE
        self.memory_pauses += 1
        if self.memory_pauses == 1:
            warnings.warn(
                f"memory is short ({self._memory_left()}): the cache at {self.path} stops admitting "
                f"records at {format_bytes(int(used[0]))} and training goes on reading from "
                f"storage; it looks again every {MEMORY_PAUSE:g} s",
                RuntimeWarning,
                stacklevel=3,
            )
        return True

    def room_for(self, nbytes: int, used: np.ndarray) -> bool:
        """Whether admission is open and ``nbytes`` more would leave the reserve free (``used[0]``: what the
        store holds); a question only: nothing is counted, paused or warned."""
        return self.open() and not self._gauge.short(nbytes, lambda: int(used[0]), note=False)

    def crowded(self, used: np.ndarray, missing: Callable[[], int]) -> bool:
        """Whether the memory free beside the store now can hold neither the records the store misses
        (``missing()`` bytes, asked once per look at the memory) nor as much as the store holds (``used[0]``).
        Free now, not beside the job's peak as admission counts it: the page cache gives memory back at the
        peak (an evaluation), and uses it in between. Answered again each time the gauge reads the memory
        (every 50 ms at most)."""
        held = int(used[0])
        gauge = self._gauge
        gauge.short(0, lambda: held, note=False)  # reads the memory when due
        if self._crowded_at != gauge.read_at:
            spare = max(0, gauge.beside)
            self._crowded = held > spare and missing() > spare
            self._crowded_at = gauge.read_at
        return self._crowded

    def overdrawn(self, used: np.ndarray) -> int:
        """Bytes the store should give back now, ``used[0]`` being what it holds (0 almost always: the gauge
        reads memory every 50 ms; always for a store on a disk, ``gives_back``)."""
        return self._gauge.overdrawn(lambda: int(used[0])) if self.gives_back else 0

    def shortfall(self, used: np.ndarray, growth: int = 0) -> int:
        """Bytes to give back so that the reserve is free now, memory read now (``used[0]``: the store's),
        and room for the job to grow by ``growth`` bytes at once (0 for a store on a disk)."""
        return self._gauge.shortfall(lambda: int(used[0]), growth) if self.gives_back else 0

    @property
    def gives_back(self) -> bool:
        """Whether the store gives memory back where the job grows into it: in a tmpfs only. On a disk its
        pages are page cache, which the kernel takes back at the job's peak, each record kept on the disk
        and read from it at its next hit; one given back would be read from the storage again, and
        admitted again by a process that has not seen the peak (measured on the digits job, its evaluation
        holding 96 MiB: the evaluation loader's workers gave back what the training workers admitted, every
        epoch, and the job read 28-41 MB per later epoch where torch's read 11-12)."""
        return self._gauge.held_in_memory and not self.off

    def pressure(self) -> tuple[int, int]:
        """(the job's own memory at its peak, the limit that binds), bytes, as last read; (0, 0) before."""
        gauge = self._gauge
        return (gauge.own_peak, gauge.last.limit) if gauge.last is not None else (0, 0)

    def note_given_back(self, nbytes: int, records: int) -> None:
        """The store gave back ``nbytes`` (``records`` records); warn the first time, read memory afresh."""
        if not self.given_back and nbytes:
            warnings.warn(
                "the job grew into the memory the cache keeps free, or is about to as workers start "
                f"({self._memory_left()}): the cache at "
                f"{self.path} gave back {format_bytes(nbytes)} ({records} records), which are read from "
                "storage again",
                RuntimeWarning,
                stacklevel=4,
            )
        self.given_back += nbytes
        self._gauge.forget()
        self._paused_until = time.monotonic() + MEMORY_PAUSE

    def _memory_left(self) -> str:
        gauge = self._gauge
        view = gauge.last
        free = f"{format_bytes(view.headroom)} free per {view.source}"
        if not gauge.held_in_memory:
            free += f", {format_bytes(gauge.held)} of it the cache's page cache"
        peak = gauge.own_peak - gauge.own
        if peak > 0:
            free += f", {format_bytes(peak)} of it for the job's own peak"
        return f"{free}, {format_bytes(self._gauge.reserve)} kept free"

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
