"""The delaying proxy (``tests/delay_proxy.py``, latency where the kernel has no netem) adds the round trip
it claims (at least it, and within 10% or 2 ms over); object storage read through it gives the folder's
records, each GET at least a round trip slower, and a read after the proxy is killed names the object, not a
hang (issue 49, requirement 1); over TLS, as a load balancer in front of object storage, to a client that
trusts its authority only."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time

import pytest
from delay_proxy import delayed
from test_object_store import bucket, server  # noqa: F401  (fixtures)

from loader import ImageFolderSource
from loader.errors import BadRecordError, SourceError
from loader.sources import S3ImageFolderSource

pytestmark = pytest.mark.multiproc


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


def _round_trip(port: int, times: int = 25) -> float:
    """The least seconds one byte took to go to ``port`` and come back, on one connection: a busy machine
    only adds to a round trip, so the least of 25 is the one the proxy's delay sets."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"w")  # the connection's first exchange, untimed
        s.recv(1)
        spent = []
        for _ in range(times):
            start = time.perf_counter()
            s.sendall(b"x")
            assert s.recv(1) == b"x"
            spent.append(time.perf_counter() - start)
    return min(spent)


@pytest.mark.parametrize("rtt_ms", [10, 50])
def test_the_proxy_adds_the_round_trip_it_claims(rtt_ms):
    echo = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    echo.daemon_threads = True
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    try:
        port = echo.server_address[1]
        direct = _round_trip(port)
        with delayed("127.0.0.1", port, rtt_ms) as (_, proxied, _proc):
            through = _round_trip(proxied)
    finally:
        echo.shutdown()
        echo.server_close()
    added_ms = (through - direct) * 1000
    assert 0.9 * rtt_ms <= added_ms <= rtt_ms + max(0.1 * rtt_ms, 2), (
        f"added {added_ms:.2f} ms for {rtt_ms} ms"
    )


def test_object_storage_through_the_proxy_is_the_folder_and_the_proxy_killed_is_named(
    bucket,  # noqa: F811
    server,  # noqa: F811
    monkeypatch,
):
    url, local = bucket
    upstream = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    with delayed("127.0.0.1", upstream, 20) as (host, port, proxy):
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        source = S3ImageFolderSource(url)
        start = time.perf_counter()
        got = [source.read(i) for i in range(3)]
        assert (time.perf_counter() - start) / 3 >= 0.020  # a GET waits at least the round trip added
        assert got == [ImageFolderSource(local).read(i) for i in range(3)]
        source.attempts = 1
        proxy.kill()  # the link gone mid-epoch (the server killed mid-epoch: test_object_store)
        proxy.wait()
        named = r"s3://data/train/class0/img003.jpg.*cannot read the object"
        with pytest.raises(BadRecordError, match=named):
            source.read(3)


def test_the_proxy_serves_tls_to_a_client_that_trusts_its_authority(
    bucket,  # noqa: F811
    server,  # noqa: F811
    monkeypatch,
    tmp_path,
):
    """As a load balancer in front of object storage: TLS to the client, plain HTTP to the server."""
    from certificates import server_certificate

    url, local = bucket
    ca, cert, key = server_certificate(tmp_path)
    upstream = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    with delayed("127.0.0.1", upstream, 10, (str(cert), str(key))) as (host, port, _):
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"https://{host}:{port}")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(ca))
        source = S3ImageFolderSource(url)
        assert [source.read(i) for i in range(3)] == [ImageFolderSource(local).read(i) for i in range(3)]
        monkeypatch.delenv("AWS_CA_BUNDLE")  # an authority the client was not told to trust: named
        with pytest.raises(SourceError, match=r"'s3://data/train' cannot be listed: .*(SSL|certificate)"):
            S3ImageFolderSource(url, attempts=1)
