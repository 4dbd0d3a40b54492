"""Latency a test can impose: a TCP proxy that holds every chunk it relays for half the round trip it adds,
each way, in order. This machine's kernel has no ``tc netem`` (its delay qdisc); the token bucket ``tbf``
that ``shaped_s3`` sets limits the rate but adds no latency. Test infrastructure, not the product.

Run as its own process (``python delay_proxy.py UPSTREAM_HOST UPSTREAM_PORT RTT_MS``: it prints the port it
listens on, on loopback), so a test can kill it mid-epoch; ``delayed(...)`` starts one and kills it on exit,
whatever happened. The proxy limits no rate: a chunk read is relayed whole once its time comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator

__all__ = ["delayed"]

CHUNK = 1 << 16


@contextlib.contextmanager
def delayed(host: str, port: int, rtt_ms: float) -> Iterator[tuple[str, int, subprocess.Popen]]:
    """A proxy to ``host:port`` that adds ``rtt_ms`` to each round trip: (its address, port, process)."""
    proxy = subprocess.Popen(
        [sys.executable, __file__, host, str(port), str(rtt_ms)], stdout=subprocess.PIPE, text=True
    )
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
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
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


async def _serve(host: str, port: int, rtt_ms: float) -> None:
    hold = rtt_ms / 2000  # half the round trip each way

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

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
