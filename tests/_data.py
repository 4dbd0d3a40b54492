"""Tiny real data for the source tests: JPEG folders, and reading through a forked child."""

from __future__ import annotations

import io
import multiprocessing
from pathlib import Path

from PIL import Image

from loader.sources import Source


def jpeg_bytes(seed: int, size: tuple[int, int] = (16, 12)) -> bytes:
    """A small real JPEG whose colour depends on ``seed``."""
    out = io.BytesIO()
    Image.new("RGB", size, (seed * 37 % 256, seed * 91 % 256, seed * 13 % 256)).save(out, format="JPEG")
    return out.getvalue()


def make_image_folder(root: Path, layout: dict[str, int]) -> list[tuple[bytes, int]]:
    """``root/<class>/img<k>.jpg`` for ``layout`` {class: count}; (bytes, label) in the sources' order."""
    records = []
    for label, name in enumerate(sorted(layout)):
        (root / name).mkdir(parents=True)
        for k in range(layout[name]):
            data = jpeg_bytes(len(records))
            (root / name / f"img{k}.jpg").write_bytes(data)
            records.append((data, label))
    return records


def read_in_fork(source: Source, indices: list[int]) -> list[bytes]:
    """``source.read`` of ``indices`` in a child forked from this process (the source is not pickled)."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_read_and_send, args=(source, indices, sender))
    child.start()
    sender.close()
    try:
        result = receiver.recv()
    finally:
        receiver.close()
        child.join(timeout=30)
    if child.exitcode != 0:
        raise RuntimeError(f"forked reader exited with {child.exitcode}")
    return result


def _read_and_send(source: Source, indices: list[int], sender) -> None:
    sender.send([source.read(i) for i in indices])
    sender.close()
