"""Small real data for tests: an in-memory source and tiny JPEG folders."""

from __future__ import annotations

import hashlib
import io
import os
import signal
from pathlib import Path

import numpy as np
from PIL import Image

from loader.errors import BadRecordError
from loader.sources import Source


class MemorySource(Source):
    """Records held in a list: record i is ``size`` bytes that encode i, label i % 10."""

    thread_safe_reads = True

    def __init__(self, n: int, size: int = 512, salt: str = "") -> None:
        self.records = [_payload(i, size) for i in range(n)]
        self.salt = salt

    def __len__(self) -> int:
        return len(self.records)

    def read(self, index: int) -> bytes:
        if self.records[index] is None:
            raise BadRecordError(self.describe(index), index, "record is missing")
        return self.records[index]

    def label(self, index: int) -> int:
        return index % 10

    def describe(self, index: int) -> str:
        return f"memory[{index}]"

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"{len(self.records)}-{self.salt}".encode()).hexdigest()


def _payload(i: int, size: int) -> bytes:
    return i.to_bytes(8, "little") * (size // 8)


def index_of(raw: bytes) -> int:
    """The record index a MemorySource payload encodes."""
    return int.from_bytes(raw[:8], "little")


def first_index(raw) -> int:
    """A transform for tests: the payload's record index (picklable, module level)."""
    return index_of(raw)


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each ends stallbench as Ctrl-C does


def stops_at_defaults() -> None:
    """A ``preexec_fn``: the child in a process group of its own with SIGINT, SIGTERM and SIGHUP at their
    defaults, whatever the shell running the tests ignores (a background shell ignores SIGINT)."""
    os.setpgid(0, 0)
    for signum in STOPS:
        signal.signal(signum, signal.SIG_DFL)


def make_jpeg_folder(root: Path, per_class: int = 4, classes: int = 2, size=(64, 48)) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for k in range(per_class):
            pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
            (root / f"class{c}" / f"img{k:03d}.jpg").write_bytes(buf.getvalue())
    return root


def upload_jpegs(local: Path, bucket: str = "data", prefix: str = "train") -> int:
    """Every JPEG under ``local`` put as ``s3://BUCKET/PREFIX/<its path there>`` on the S3 server the
    environment names (``s3_server``), the bucket made first; returns the bytes put."""
    import boto3  # only the object-storage tests need it

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    total = 0
    for path in sorted(local.rglob("*.jpg")):
        body = path.read_bytes()
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(local)}", Body=body)
        total += len(body)
    return total


def documented_command(doc: Path, starts: str) -> list[str]:
    """The arguments of the first command in ``doc`` whose line starts with ``starts``, as written there
    (``stallbench compare ...`` -> ``["compare", ...]``)."""
    import shlex

    line = next(x for x in doc.read_text().splitlines() if x.startswith(starts))
    return shlex.split(line)[1:]
