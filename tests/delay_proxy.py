"""Latency a test can impose: a TCP proxy that holds every chunk it relays for half the round trip it adds,
each way, in order. This machine's kernel has no ``tc netem`` (its delay qdisc); the token bucket ``tbf``
that ``shaped_s3`` sets limits the rate but adds no latency. Test infrastructure, not the product.

Run as its own process (``python delay_proxy.py UPSTREAM_HOST UPSTREAM_PORT RTT_MS [CERT KEY]``: it prints
the port it listens on, on loopback), so a test can kill it mid-epoch; ``delayed(...)`` starts one and kills
it on exit, whatever happened. The proxy limits no rate: a chunk read is relayed whole once its time comes.

With a certificate and key it speaks TLS to its clients and plain HTTP to the server, as a load balancer in
front of object storage does: moto's server does each TLS handshake in its one accepting thread, so with
latency added its handshakes queue one behind the other (1,000 GETs with 10 ms: 12.9 s against 5.0 s in
plain HTTP), which no real endpoint does; the proxy's handshakes run side by side, on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import sys
from collections.abc import Iterator

__all__ = ["delayed"]

CHUNK = 1 << 16


@contextlib.contextmanager
def delayed(
    host: str, port: int, rtt_ms: float, tls: tuple[str, str] | None = None
) -> Iterator[tuple[str, int, subprocess.Popen]]:
    """A proxy to ``host:port`` that adds ``rtt_ms`` to each round trip: (its address, port, process).
    ``tls``: its certificate and key files, to serve its clients over TLS."""
    argv = [sys.executable, __file__, host, str(port), str(rtt_ms), *(tls or ())]
    proxy = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        listening = proxy.stdout.readline()
        if not listening.strip().isdigit():
            raise RuntimeError(f"the delaying proxy did not start (exit {proxy.wait(10)})")
        yield "127.0.0.1", int(listening), proxy
    finally:
        proxy.kill()
        proxy.wait()
        proxy.stdout.close()


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: float) -> None:
    """Bytes from ``reader`` to ``writer``, each chunk ``hold`` seconds after it arrived, in order; the end
    of the stream likewise."""
    loop = asyncio.get_running_loop()
    due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            at, data = await due.get()
            await asyncio.sleep(max(0.0, at - loop.time()))
            if not data:  # the end: a TLS stream has no half-close, so it is closed
                with contextlib.suppress(OSError):
                    writer.write_eof() if writer.can_write_eof() else writer.close()
                return
            writer.write(data)
            await writer.drain()

    delivering = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(CHUNK)
            due.put_nowait((loop.time() + hold, data))
            if not data:
                break
        await delivering
    except (ConnectionError, OSError):
        delivering.cancel()


async def _serve(host: str, port: int, rtt_ms: float, *tls: str) -> None:
    hold = rtt_ms / 2000  # half the round trip each way
    context = None
    if tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)

    async def connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _relay(client_reader, upstream_writer, hold), _relay(upstream_reader, client_writer, hold)
        )
        for writer in (client_writer, upstream_writer):
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0, ssl=context)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), *sys.argv[4:6]))
