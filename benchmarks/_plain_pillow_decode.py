"""Decode rate of a folder of JPEGs on one core, as a standalone process; prints one JSON line.

Mode "plain" runs torchvision's train steps with whatever PIL is importable (the benchmark puts plain Pillow
first on PYTHONPATH): full decode, RandomResizedCrop geometry, crop then bilinear resize, flip, CHW numpy.
It needs only the standard library, PIL and numpy. Mode "ours" times ``loader.fetching.decode.TrainTransform``
instead (the repository root must be on PYTHONPATH; it imports torch).

usage: python _plain_pillow_decode.py FOLDER COUNT {plain,ours} [--cpu N] [--seed S] [--wait]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

SIZE = 224
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
WARMUP = 20


def random_resized_crop(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision ``RandomResizedCrop.get_params`` as a (left, top, right, bottom) box."""
    log_low, log_high = math.log(RATIO[0]), math.log(RATIO[1])
    for _ in range(10):
        target_area = width * height * random.uniform(*SCALE)
        aspect = math.exp(random.uniform(log_low, log_high))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = random.randint(0, height - h), random.randint(0, width - w)
            return (left, top, left + w, top + h)
    w, h = width, height
    if width / height < RATIO[0]:
        h = round(w / RATIO[0])
    elif width / height > RATIO[1]:
        w = round(h * RATIO[1])
    top, left = (height - h) // 2, (width - w) // 2
    return (left, top, left + w, top + h)


def plain_train(raw: bytes) -> np.ndarray:
    """torchvision's RandomResizedCrop + flip + PILToTensor steps, converting only non-RGB images.

    (torchvision's ``pil_loader`` converts every image, an extra copy; without it the baseline is fairer.)
    """
    img = Image.open(io.BytesIO(raw))
    if img.mode != "RGB":
        img = img.convert("RGB")
    img = img.crop(random_resized_crop(*img.size)).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    if random.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1))


def make_step(mode: str) -> Callable[[bytes], object]:
    if mode == "plain":
        return plain_train
    from loader.fetching.decode import (
        TrainTransform,
    )  # only in mode "ours"; needs the repository on PYTHONPATH

    return TrainTransform(size=SIZE, scale=SCALE, ratio=RATIO)


def measure(records: list[bytes], count: int, step: Callable[[bytes], object], wait: bool) -> float:
    """Images per second over ``count`` decodes, cycling through ``records`` after a short warm-up.

    With ``wait``, print "ready" after the warm-up and start on the next line of stdin, so a parent process
    can time the decoding alone, without interpreter start-up and imports.
    """
    for raw in records[:WARMUP]:
        step(raw)
    if wait:
        print("ready", flush=True)
        sys.stdin.readline()
    start = time.perf_counter()
    for i in range(count):
        step(records[i % len(records)])
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("count", type=int)
    parser.add_argument("mode", choices=["plain", "ours"])
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wait", action="store_true", help='print "ready", then start on a line of stdin')
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    records = [path.read_bytes() for path in sorted(args.folder.glob("*.jpg"))]
    if not records:
        parser.error(f"no *.jpg files in {args.folder}")
    random.seed(args.seed)
    rate = measure(records, args.count, make_step(args.mode), args.wait)
    print(json.dumps({"images_per_s": rate, "pil": PIL.__version__, "pil_path": PIL.__file__}))


if __name__ == "__main__":
    main()
