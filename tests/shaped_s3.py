"""An S3-compatible server (moto's) behind a link whose rate the kernel sets: a network namespace of its own,
reached over a veth pair, with a token bucket (``tc qdisc tbf``) on the server's side, so every byte it
sends waits for the link as it would on a real network. Needs root (CI runs as root).

Latency is not imposed here: ``tc netem``, the kernel's delay, is not built into this machine's kernel
(``qdisc kind is unknown``); the token bucket is. A test adds latency with ``delay_proxy.delayed``, a
proxy between the client and the server that holds each chunk for half the round trip, each way. The
namespace, the pair and the server are removed on exit, whatever happened (only what this run made); names
and addresses carry this process's id, so runs side by side do not meet.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ShapedServer", "shaped_s3_server"]


@dataclass(frozen=True)
class ShapedServer:
    endpoint: str  # http://<address>:<port>, for AWS_ENDPOINT_URL
    rate_bits: int  # the link's rate, bits per second, server to client


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _wait_for(address: str, port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server.poll() is None:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((address, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"moto's S3 server in its namespace did not answer on {address}:{port} within 30 s")


def _pair_addresses(pid: int) -> tuple[str, str]:
    """A /30 of 10.0.0.0/8 that only this process id uses: (this side, the server's side)."""
    base = (10 << 24) + 4 * pid  # pid < 2**22
    return tuple(str(ipaddress.IPv4Address(base + k)) for k in (1, 2))  # type: ignore[return-value]


@contextlib.contextmanager
def shaped_s3_server(rate_bits: int) -> Iterator[ShapedServer]:
    """moto's server in a namespace of its own, sending at most ``rate_bits`` per second to this one."""
    pid = os.getpid()
    ns, host, inside = f"sb-s3-{pid}", f"sbh{pid}", f"sbn{pid}"
    near, far = _pair_addresses(pid)
    made: list[tuple[str, ...]] = []  # what to delete, last made first
    server = None
    try:
        _ip("netns", "add", ns)
        made.append(("netns", "del", ns))  # the pair goes with it once moved in
        _ip("link", "add", host, "type", "veth", "peer", "name", inside)
        made.append(("link", "del", host))
        _ip("link", "set", inside, "netns", ns)
        _ip("addr", "add", f"{near}/30", "dev", host)
        _ip("link", "set", host, "up")
        _ip("-n", ns, "addr", "add", f"{far}/30", "dev", inside)
        _ip("-n", ns, "link", "set", inside, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        burst = max(64 << 10, rate_bits // 8 // 100)  # 10 ms of the rate, at least 64 KiB
        subprocess.run(
            ["tc", "-n", ns, "qdisc", "add", "dev", inside, "root", "tbf", "rate", f"{rate_bits}bit",
             "burst", str(burst), "latency", "100ms"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "moto.server", "-H", far, "-p", "5000"]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(far, 5000, server)
        yield ShapedServer(f"http://{far}:5000", rate_bits)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for undo in reversed(made):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip(*undo)
