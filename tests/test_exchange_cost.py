"""stallbench.analysis.exchange_cost: the CPU a record from a peer costs, measured through the loader's own
exchange between two real processes and kept for the boot; a stopped or killed process fails the probe in
bounded time, leaving no process and no inbox behind; a kept file that is damaged or stale is measured
again, never trusted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from stallbench.analysis import exchange_cost as module
from stallbench.analysis.exchange_cost import ExchangeCost, exchange_cost, measure_exchange_cost
from stallbench.jobs.leftovers import RUN_PREFIX

SHM = Path("/dev/shm")
pytestmark = pytest.mark.multiproc  # each probe starts two processes


def probe_processes() -> list[psutil.Process]:
    """This process's children that are an exchange probe; another test's child not yet reaped (a zombie:
    its command line is gone) is none."""
    probes = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess):
            if "stallbench.analysis.exchange_cost" in " ".join(child.cmdline()):
                probes.append(child)
    return probes


def shm() -> set[str]:
    """The run folders of this process in /dev/shm (other tests and users make theirs beside them): the
    probe's scratch folder of inboxes is gone after it, whatever happened."""
    return {p.name for p in SHM.glob(f"{RUN_PREFIX}-{os.getpid()}-*")}


def test_a_record_from_a_peer_costs_cpu_per_record_and_per_byte():
    before = shm()
    cost = measure_exchange_cost()
    # 250-550 us for a 112 KB record on this machine: tens of microseconds to a few milliseconds a record,
    # under 100 ns a byte, and small records cost more a byte than large ones (each pays a file and a digest)
    assert 1e-5 < cost.per_record_s < 5e-3 and 0 < cost.per_byte_s < 1e-7
    assert cost.per_byte(8192) > cost.per_byte(114_688) > cost.per_byte(1 << 20)
    assert not probe_processes() and shm() == before


def test_the_cost_is_kept_for_the_boot_and_measured_again_when_damaged_or_stale(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "stallbench"
    kept = folder / module.KEPT
    first = exchange_cost()
    assert folder.stat().st_mode & 0o777 == 0o700
    assert json.loads(kept.read_text())["boot"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert kept.stat().st_mode & 0o777 == 0o600

    measured = ExchangeCost(1e-4, 1e-9)  # what a new probe gives, from here on
    monkeypatch.setattr(module, "measure_exchange_cost", lambda: measured)
    assert exchange_cost() == first  # kept: no probe
    boot = json.loads(kept.read_text())["boot"]
    stale = {"boot": "another boot", "per_record_s": 1e-3, "per_byte_s": 1e-9}
    negative = {"boot": boot, "per_record_s": -1, "per_byte_s": 0}
    missing = {"boot": boot, "per_record_s": 1e-3}
    for damage in ("{not json", json.dumps(stale), json.dumps(negative), json.dumps(missing), "[1, 2]"):
        kept.write_text(damage)
        assert exchange_cost() == measured  # measured again, and kept in its place
        assert exchange_cost() == measured and json.loads(kept.read_text())["per_record_s"] == 1e-4
    kept.unlink()
    (folder / f".{module.KEPT}-{os.getpid()}").write_text("left by a dead process of this pid")
    assert exchange_cost() == measured and exchange_cost() == measured  # kept all the same
    assert kept.exists() and [p.name for p in folder.glob(f".{module.KEPT}-*")] == []


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL])
def test_a_stopped_or_killed_process_fails_the_probe_in_bounded_time(sig):
    before, hit = shm(), []

    def strike() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not hit:
            for p in probe_processes():
                if p.cmdline()[-1] == "1":  # rank 1, as soon as it runs
                    os.kill(p.pid, sig)
                    hit.append(p.pid)
            time.sleep(0.005)

    striker = threading.Thread(target=strike)
    striker.start()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="the exchange probe"):
        measure_exchange_cost(timeout=8)
    striker.join()
    assert hit and time.monotonic() - start < 20
    assert not probe_processes() and not psutil.pid_exists(hit[0])
    assert shm() == before
