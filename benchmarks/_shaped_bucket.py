"""The object storage benchmarks' bucket: generated JPEGs in moto's S3 server behind a link the kernel shapes
(``tests/shaped_s3.py``), latency added by a proxy (``tests/delay_proxy.py``), and the timing of a loader's
epochs over it."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import torch.utils.data

from stallbench.workloads import make_jpeg_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from certificates import server_certificate, trusting
from delay_proxy import delayed
from shaped_s3 import shaped_s3_server

__all__ = ["EPOCHS", "MB", "RECORDS", "URL", "count", "epochs", "latency", "shaped_bucket"]

RECORDS, RECORD_BYTES, RATE_BITS, EPOCHS = 3_000, 114_688, 200_000_000, 3
URL = "s3://data/train"
MB = 1e6


def count(batch: list) -> torch.Tensor:
    """A batch that only says how many samples it holds (a tensor of that length: Streaming's loader reads a
    batch's size from it), so the epoch is the fetch path alone."""
    return torch.ones(len(batch), dtype=torch.uint8)


@contextlib.contextmanager
def shaped_bucket(root: Path) -> Iterator[float]:
    """The images (made once under ``root``) in the shaped server's bucket, boto3 and the processes it starts
    pointed at it; yields the link's rate in bytes/s, as one GET measures it."""
    folder = root / f"jpeg-{RECORDS}x{RECORD_BYTES}"
    images = make_jpeg_folder(folder, num_images=RECORDS, record_bytes=RECORD_BYTES)
    with shaped_s3_server(RATE_BITS) as server:
        env = dict(AWS_ENDPOINT_URL=server.endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
        with _environment(env):
            os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
            s3 = boto3.client("s3")
            s3.create_bucket(Bucket="data")
            for path in sorted(images.rglob("*.jpg")):
                s3.put_object(Bucket="data", Key=f"train/{path.relative_to(images)}", Body=path.read_bytes())
            s3.put_object(Bucket="data", Key="probe", Body=os.urandom(32 << 20))
            start = time.perf_counter()
            got = len(s3.get_object(Bucket="data", Key="probe")["Body"].read())
            yield got / (time.perf_counter() - start)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def epochs(dl: torch.utils.data.DataLoader, fetched) -> list[tuple[float, int | None]]:
    """(seconds, bytes fetched or None where the loader does not count them) per epoch."""
    out = []
    for _ in range(EPOCHS):
        before, start = fetched(), time.perf_counter()
        assert sum(len(batch) for batch in dl) == RECORDS  # every record, once
        after = fetched()
        out.append((time.perf_counter() - start, None if after is None else after - before))
    return out


@contextlib.contextmanager
def latency(rtt_ms: int, tls_folder: Path | None = None) -> Iterator[None]:
    """boto3 (and the processes it starts) pointed at a proxy adding ``rtt_ms`` to each round trip to the
    shaped server (none: as it is). ``tls_folder``: the proxy serves HTTPS, its certificate (written there)
    from an authority of the run's own that boto3, curl and obstore are told to trust."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    if not rtt_ms and tls_folder is None:
        yield
        return
    env, tls = {}, None
    if tls_folder is not None:
        ca, cert, key = server_certificate(tls_folder)
        env, tls = trusting(ca), (str(cert), str(key))
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    with delayed(host, int(port), rtt_ms, tls) as (near, proxy_port, _):
        scheme = "https" if tls else "http"
        with _environment({**env, "AWS_ENDPOINT_URL": f"{scheme}://{near}:{proxy_port}"}):
            yield
