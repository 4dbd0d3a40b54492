"""The embedded default datasets: a folder of JPEG images and a file of token sequences, made from a seed.

Each generator writes into a temporary sibling and renames it into place, so a reader never sees half a
dataset. The parameters are kept with the data (a manifest file in an image folder, the schema metadata of an
Arrow file): asking again for the same dataset returns at once, asking for a different one at the same path
raises ``ValueError`` unless ``overwrite=True``. Equal parameters give equal bytes with the same Pillow build.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

__all__ = [
    "DEFAULT_IMAGE_COUNT",
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_RECORD_BYTES",
    "MANIFEST_NAME",
    "default_image_workload",
    "make_jpeg_folder",
    "make_token_arrow",
]

DEFAULT_IMAGE_COUNT = 6_000  # the demo set: ~670 MB, well above a job's own memory; made in ~5 s
DEFAULT_IMAGE_SIZE = (500, 375)  # width, height of a typical ImageNet photo
DEFAULT_RECORD_BYTES = 112_000  # the mean ImageNet training JPEG
MANIFEST_NAME = ".stallbench-workload.json"
_POOL = 64  # distinct pictures; every record is one of them plus its own comment bytes
_COM_MAX = 65_533  # payload bytes of one JPEG comment segment
_ARROW_BATCH = 4_096  # sequences per Arrow record batch
_META_KEY = b"stallbench-workload"


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def _existing_matches(target: Path, wanted: dict, found: dict | None, overwrite: bool) -> bool:
    """True when ``target`` already holds ``wanted``; raise when it holds something we may not replace."""
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        return False
    if found == wanted:
        return True
    if found is None:
        raise ValueError(f"{target} exists and was not made by stallbench; remove it or choose another path")
    if not overwrite:
        diff = ", ".join(
            f"{k}={found.get(k)!r} (wanted {v!r})" for k, v in wanted.items() if found.get(k) != v
        )
        raise ValueError(f"{target} holds a workload made with other parameters: {diff}; pass overwrite=True")
    return False


def _read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((root / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


def _base_jpeg(rng: np.random.Generator, width: int, height: int, quality: int) -> bytes:
    """A natural-looking picture: smooth colour fields at three scales plus sensor-like noise."""
    acc = np.full((height, width, 3), 128.0, np.float32)
    for (gw, gh), amp in (((4, 3), 150.0), ((16, 12), 60.0), ((64, 48), 25.0)):
        small = Image.fromarray(rng.integers(0, 256, (gh, gw, 3), dtype=np.uint8))
        acc += (np.asarray(small.resize((width, height), Image.BICUBIC), np.float32) - 128.0) * (amp / 128.0)
    acc += 10.0 * rng.standard_normal((height, width, 3), dtype=np.float32)
    buf = io.BytesIO()
    Image.fromarray(np.clip(acc, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _unique_record(base: bytes, tag: bytes, pad: int, rng: np.random.Generator) -> bytes:
    """``base`` plus ``pad`` bytes: comment segments after SOI, holding ``tag`` then random bytes."""
    nseg = -(-pad // (_COM_MAX + 4))
    payload = tag + rng.bytes(pad - 4 * nseg - len(tag))
    cuts = [len(payload) * k // nseg for k in range(nseg + 1)]
    segs = [b"\xff\xfe" + (e - s + 2).to_bytes(2, "big") + payload[s:e] for s, e in pairwise(cuts)]
    return base[:2] + b"".join(segs) + base[2:]


def _check_image_args(num_images: int, num_classes: int, width: int, height: int, quality: int) -> None:
    for name, value in (("num_images", num_images), ("num_classes", num_classes)):
        _positive(name, value)
    for name, value in (("width", width), ("height", height)):
        if _positive(name, value) > 65_500:
            raise ValueError(f"{name} must be at most 65500 (the JPEG limit), got {value}")
    if num_classes > num_images:
        raise ValueError(f"num_classes ({num_classes}) must not exceed num_images ({num_images})")
    if not 1 <= _positive("quality", quality) <= 100:
        raise ValueError(f"quality must be in 1..100, got {quality}")


def _write_images(tmp: Path, params: dict, progress: Callable[[int, int], None] | None) -> None:
    n, classes, target = params["num_images"], params["num_classes"], params["record_bytes"]
    rng = np.random.default_rng(params["seed"])
    pool = [
        _base_jpeg(rng, params["width"], params["height"], params["quality"]) for _ in range(min(_POOL, n))
    ]
    tag_len = len(f"stallbench {params['seed']} {n}")
    if target is not None and target < max(map(len, pool)) + 4 * -(-target // _COM_MAX) + tag_len:
        raise ValueError(
            f"record_bytes={target} is below the JPEG content size ({max(map(len, pool))} bytes "
            f"at {params['width']}x{params['height']}, quality {params['quality']}); raise it"
        )
    cw, iw = max(2, len(str(classes - 1))), max(6, len(str(n - 1)))
    for c in range(classes):
        (tmp / f"class_{c:0{cw}d}").mkdir()
    for i, b in enumerate(rng.integers(0, len(pool), n)):
        base, tag = pool[b], f"stallbench {params['seed']} {i}".encode()
        pad = target - len(base) if target is not None else len(tag) + 20
        (tmp / f"class_{i % classes:0{cw}d}" / f"img_{i:0{iw}d}.jpg").write_bytes(
            _unique_record(base, tag, pad, rng)
        )
        if progress is not None and ((i + 1) % 256 == 0 or i + 1 == n):
            progress(i + 1, n)


def make_jpeg_folder(
    root: str | os.PathLike,
    *,
    num_images: int,
    num_classes: int = 10,
    width: int = 500,
    height: int = 375,
    quality: int = 90,
    record_bytes: int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``root/class_XX/img_XXXXXX.jpg`` (ImageNet layout), image ``i`` in class ``i % num_classes``.

    With ``record_bytes`` every file has exactly that size (padding sits in JPEG comment segments, which
    decoders skip). ``progress(done, total)`` is called every 256 images. Returns ``root``.
    """
    _check_image_args(num_images, num_classes, width, height, quality)
    if record_bytes is not None:
        _positive("record_bytes", record_bytes)
    _check_seed(seed)
    params = {
        "kind": "jpeg-folder",
        "format": 1,
        "num_images": num_images,
        "num_classes": num_classes,
        "width": width,
        "height": height,
        "quality": quality,
        "record_bytes": record_bytes,
        "seed": seed,
    }
    root = Path(root)
    if _existing_matches(root, params, _read_manifest(root), overwrite):
        return root
    tmp = root.with_name(f"{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a crashed run whose pid we now have
    tmp.mkdir(parents=True)
    try:
        _write_images(tmp, params, progress)
        (tmp / MANIFEST_NAME).write_text(json.dumps(params, indent=1))
        _move_into_place(tmp, root, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _move_into_place(tmp: Path, root: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``root``; another process finishing the same workload first is fine."""
    if overwrite and root.exists():
        shutil.rmtree(root)
    try:
        os.rename(tmp, root)
    except OSError:
        if _read_manifest(root) != _read_manifest(tmp):
            raise


def _token_batches(params: dict) -> Iterator[pa.RecordBatch]:
    rng, lo, hi = np.random.default_rng(params["seed"]), params["min_len"], params["max_len"]
    mu, sigma = (np.log(lo) + np.log(hi)) / 2, max((np.log(hi) - np.log(lo)) / 4, 1e-9)
    rows = max(1, min(_ARROW_BATCH, 2**28 // hi))  # int32 offsets: at most 2**28 tokens per batch
    for start in range(0, params["num_sequences"], rows):
        count = min(rows, params["num_sequences"] - start)
        lengths = np.clip(np.rint(rng.lognormal(mu, sigma, count)), lo, hi).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = rng.integers(0, params["vocab"], int(offsets[-1]), dtype=np.int32)
        yield pa.record_batch([pa.ListArray.from_arrays(offsets, values)], names=["tokens"])


def _arrow_params(path: Path) -> dict | None:
    try:
        with pa.memory_map(str(path)) as source:
            meta = pa.ipc.open_file(source).schema.metadata or {}
        return json.loads(meta[_META_KEY])
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None


def make_token_arrow(
    path: str | os.PathLike,
    *,
    num_sequences: int,
    min_len: int,
    max_len: int,
    vocab: int = 32_000,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Write an Arrow IPC file with one ``list<int32>`` column ``tokens``; returns ``path``.

    Lengths are log-normal with median ``sqrt(min_len * max_len)``, clipped to ``[min_len, max_len]``;
    token ids are uniform in ``[0, vocab)``. The parameters live in the schema metadata.
    """
    _positive("num_sequences", num_sequences)
    if _positive("min_len", min_len) > _positive("max_len", max_len):
        raise ValueError(f"min_len ({min_len}) must not exceed max_len ({max_len})")
    if not 2 <= _positive("vocab", vocab) <= 2**31:
        raise ValueError(f"vocab must be in 2..2**31 for int32 token ids, got {vocab}")
    _check_seed(seed)
    params = {
        "kind": "token-arrow",
        "format": 1,
        "num_sequences": num_sequences,
        "min_len": min_len,
        "max_len": max_len,
        "vocab": vocab,
        "seed": seed,
    }
    path = Path(path)
    if _existing_matches(path, params, _arrow_params(path), overwrite):
        return path
    schema = pa.schema([("tokens", pa.list_(pa.int32()))], metadata={_META_KEY: json.dumps(params)})
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in _token_batches(params):
                writer.write_batch(batch)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def default_image_workload(
    data_dir: str | os.PathLike,
    *,
    num_images: int = DEFAULT_IMAGE_COUNT,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """The demo's image set under ``data_dir``: ``num_images`` JPEGs of ``DEFAULT_RECORD_BYTES``."""
    width, height = DEFAULT_IMAGE_SIZE
    return make_jpeg_folder(
        Path(data_dir) / f"images-{num_images}",
        num_images=num_images,
        num_classes=min(10, num_images),
        width=width,
        height=height,
        record_bytes=DEFAULT_RECORD_BYTES,
        seed=seed,
        progress=progress,
    )
