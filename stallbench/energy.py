"""Energy: read from the machine's counters where it can be, estimated from CPU time (and said so) where not.

* **RAPL** (``/sys/class/powercap/intel-rapl:N/energy_uj``, one zone per CPU package; Linux names AMD's the
  same): microjoules the package used, machine-wide (every process on it, not this job alone). The counter
  wraps at ``max_energy_range_uj``; a reading below the last one has wrapped once. Recent kernels let only
  root read it.
* **NVML** (``pynvml``, when it is installed and sees a GPU): each GPU's total energy in millijoules.
* **estimate**: where neither is readable, ``ESTIMATE_WATTS_PER_CORE`` for every CPU second the job's
  processes used. It leaves out idle power, memory, disks and any GPU: a rough figure, always labelled
  ``"estimate"``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

__all__ = [
    "ESTIMATE",
    "ESTIMATE_WATTS_PER_CORE",
    "POWERCAP",
    "EnergyMeter",
    "NvmlCounter",
    "RaplCounter",
    "estimate_joules",
    "open_meter",
]

POWERCAP = Path("/sys/class/powercap")
ESTIMATE = "estimate"
# A busy server core: a 2-socket machine of 2 x 32 cores at 2 x 200 W package power, ~6 W a core, plus its
# share of memory and uncore; 10 W is the round figure such machines draw per busy core at the wall.
ESTIMATE_WATTS_PER_CORE = 10.0
_PACKAGE = re.compile(r"^intel-rapl:\d+$")  # a package zone; its subzones (core, dram) are inside it


def estimate_joules(cpu_seconds: float) -> float:
    """Joules for ``cpu_seconds`` of busy cores at ``ESTIMATE_WATTS_PER_CORE``."""
    return cpu_seconds * ESTIMATE_WATTS_PER_CORE


class Counter(Protocol):
    source: str

    def joules(self) -> float: ...


class RaplCounter:
    """The package zones under ``root``: joules used since this counter was made, wraps counted."""

    source = "rapl"

    def __init__(self, root: Path = POWERCAP) -> None:
        zones = sorted(p for p in root.glob("intel-rapl:*") if _PACKAGE.match(p.name))
        if not zones:
            raise OSError(f"no RAPL package zone under {root}")
        self._zones = [(z / "energy_uj", int((z / "max_energy_range_uj").read_text())) for z in zones]
        self._last = [int(path.read_text()) for path, _ in self._zones]  # OSError where not readable
        self._total_uj = 0

    def joules(self) -> float:
        for k, (path, wrap) in enumerate(self._zones):
            now = int(path.read_text())
            self._total_uj += now - self._last[k] + (wrap if now < self._last[k] else 0)
            self._last[k] = now
        return self._total_uj / 1e6


class NvmlCounter:
    """Every GPU NVML sees: joules used since this counter was made."""

    source = "nvml"

    def __init__(self) -> None:
        import pynvml  # ImportError where it is not installed

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise OSError("NVML sees no GPU")
        self._nvml = pynvml
        self._devices = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._start_mj = self._millijoules()

    def _millijoules(self) -> int:
        return sum(self._nvml.nvmlDeviceGetTotalEnergyConsumption(d) for d in self._devices)

    def joules(self) -> float:
        return (self._millijoules() - self._start_mj) / 1e3


class EnergyMeter:
    """The readable counters together: ``source`` names them ("rapl", "nvml", "rapl+nvml")."""

    def __init__(self, counters: Sequence[Counter]) -> None:
        if not counters:
            raise ValueError("an EnergyMeter needs at least one counter")
        self._counters = list(counters)
        self.source = "+".join(c.source for c in counters)

    def joules(self) -> float:
        """Joules used since the counters were made, all of them summed."""
        return sum(c.joules() for c in self._counters)


def open_meter(powercap: Path = POWERCAP) -> EnergyMeter | None:
    """A meter over every counter readable here; None where none is (then estimate from CPU time)."""
    counters: list[Counter] = []
    for make in (lambda: RaplCounter(powercap), NvmlCounter):
        try:
            counters.append(make())
        except Exception:  # absent, unreadable, no device, a driver's own error: this counter is not here
            continue
    return EnergyMeter(counters) if counters else None
