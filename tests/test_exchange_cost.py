"""stallbench.analysis.exchange_cost: the CPU a record from a peer costs, measured through the loader's own
exchange between two real processes; a stopped or killed one fails the probe, in bounded time, leaving no
process and no inbox behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from stallbench.analysis.exchange_cost import measure_exchange_cpu

INBOXES = Path("/dev/shm") / f"stallbench-{os.geteuid()}"


def probe_processes() -> list[psutil.Process]:
    return [
        p for p in psutil.Process().children() if "stallbench.analysis.exchange_cost" in " ".join(p.cmdline())
    ]


def inboxes() -> set[str]:
    return {p.name for p in INBOXES.glob("peers-r*")} if INBOXES.exists() else set()


def test_a_record_from_a_peer_costs_cpu_in_proportion_to_its_bytes():
    before = inboxes()
    small, large = measure_exchange_cpu(8192), measure_exchange_cpu(1 << 20)
    # 250 us for 112 KB on this machine (bench_partition): nanoseconds a byte, and a large record costs
    # less a byte than a small one (each record pays a file in the inbox and a digest)
    assert 1e-11 < large < small < 1e-6
    assert not probe_processes() and inboxes() == before


def test_a_bad_record_size_is_refused():
    with pytest.raises(ValueError, match="record_bytes must be positive, got 0"):
        measure_exchange_cpu(0)


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL])
def test_a_stopped_or_killed_process_fails_the_probe_in_bounded_time(sig):
    before, hit = inboxes(), []

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
        measure_exchange_cpu(114_688, timeout=8)
    striker.join()
    assert hit and time.monotonic() - start < 20
    assert not probe_processes() and not psutil.pid_exists(hit[0])
    assert inboxes() == before
