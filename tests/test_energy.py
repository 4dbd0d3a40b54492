"""stallbench.energy: RAPL read from a fake sysfs tree (wraparound included), NVML absent, the estimate."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stallbench.energy import ESTIMATE_WATTS_PER_CORE, EnergyMeter, RaplCounter, estimate_joules, open_meter


def _zone(root: Path, name: str, uj: int, wrap: int = 1_000_000) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{wrap}\n")
    return zone


def test_rapl_sums_the_packages_and_leaves_their_subzones_out(tmp_path):
    zones = [_zone(tmp_path, "intel-rapl:0", 100), _zone(tmp_path, "intel-rapl:1", 5_000)]
    core = _zone(tmp_path, "intel-rapl:0:0", 0)  # inside package 0: counting it would count twice
    counter = RaplCounter(tmp_path)
    (zones[0] / "energy_uj").write_text("600100\n")
    (zones[1] / "energy_uj").write_text("405000\n")
    (core / "energy_uj").write_text("999999\n")
    assert counter.joules() == pytest.approx(1.0)  # 0.6 J + 0.4 J


def test_rapl_counts_a_wrap_of_the_counter(tmp_path):
    zone = _zone(tmp_path, "intel-rapl:0", 900_000, wrap=1_000_000)
    counter = RaplCounter(tmp_path)
    (zone / "energy_uj").write_text("200000\n")  # went past 1_000_000 and started again at 0
    assert counter.joules() == pytest.approx(0.3)
    (zone / "energy_uj").write_text("700000\n")
    assert counter.joules() == pytest.approx(0.8)  # cumulative


def test_no_rapl_tree_and_no_nvml_give_no_meter(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(OSError, match="no RAPL package zone"):
        RaplCounter(tmp_path)
    assert open_meter(tmp_path) is None


def test_unreadable_rapl_gives_no_meter(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    zone = _zone(tmp_path, "intel-rapl:0", 1)
    (zone / "energy_uj").unlink()  # as good as mode 0400 for a user: it cannot be read
    assert open_meter(tmp_path) is None


def test_a_readable_rapl_makes_the_meter(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    zone = _zone(tmp_path, "intel-rapl:0", 0)
    meter = open_meter(tmp_path)
    (zone / "energy_uj").write_text("2500000\n")
    assert meter is not None and meter.source == "rapl" and meter.joules() == pytest.approx(2.5)


class _Fixed:
    def __init__(self, source: str, joules: float) -> None:
        self.source, self._joules = source, joules

    def joules(self) -> float:
        return self._joules


def test_meter_sums_its_counters_and_names_them():
    meter = EnergyMeter([_Fixed("rapl", 2.0), _Fixed("nvml", 3.0)])
    assert (meter.source, meter.joules()) == ("rapl+nvml", 5.0)
    with pytest.raises(ValueError, match="at least one counter"):
        EnergyMeter([])


def test_estimate_is_the_documented_watts_per_busy_core():
    assert estimate_joules(3.0) == 3.0 * ESTIMATE_WATTS_PER_CORE
    assert "10 W per busy core" in (Path(__file__).parents[1] / "docs" / "stallbench.md").read_text()
    assert ESTIMATE_WATTS_PER_CORE == 10.0
