"""Image decode and augmentation without torchvision: record bytes -> uint8 CHW RGB tensor.

The crop is chosen in the coordinates of the encoded image before anything is decoded, so a JPEG can be
decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, ``Image.draft``) whenever the crop keeps at least
the output size, and the crop and resize are one ``Image.resize(..., box=...)``.
"""

from __future__ import annotations

import contextlib
import io
import math
import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, JpegImagePlugin

from loader._pil import warn_if_not_simd

__all__ = ["EvalTransform", "TrainTransform", "make_transform", "tokens_to_tensor"]

Box = tuple[float, float, float, float]  # left, top, right, bottom
_DECODE_ERRORS = (OSError, SyntaxError, EOFError, ValueError, struct.error, Image.DecompressionBombError)
_DRAFT_SCALES = (8, 4, 2)


@contextlib.contextmanager
def _decode_errors(raw: bytes) -> Iterator[None]:
    """Turn PIL's many failure types (unidentified, truncated, broken chunk) into one ValueError."""
    try:
        yield
    except Image.UnidentifiedImageError as exc:  # its message names only a BytesIO object
        raise ValueError(f"cannot decode image: unknown format (starts with {bytes(raw[:8])!r})") from exc
    except _DECODE_ERRORS as exc:
        raise ValueError(f"cannot decode image: {exc}") from exc


def _draft(img: Image.Image, box: Box, size: int) -> Box:
    """Let a JPEG decode at the largest reduction that keeps the crop >= ``size``; return the box rescaled."""
    if not isinstance(img, JpegImagePlugin.JpegImageFile):
        return box
    crop = min(box[2] - box[0], box[3] - box[1])
    scale = next((s for s in _DRAFT_SCALES if crop >= s * size), 1)
    if scale == 1:
        return box
    width, height = img.size
    drafted = img.draft("RGB", (width // scale, height // scale))
    if drafted is None:
        return box
    factor = width / drafted[1][2]
    return (box[0] / factor, box[1] / factor, box[2] / factor, box[3] / factor)


def _decode_crop(raw: bytes, box_for: Callable[[int, int], Box], size: int, draft: bool) -> Image.Image:
    """Decode ``raw``, then resize the box ``box_for(width, height)`` picks to ``size`` x ``size`` RGB."""
    with _decode_errors(raw):
        img = Image.open(io.BytesIO(raw))
        box = box_for(*img.size)
        if draft:
            box = _draft(img, box, size)
        img.load()  # a truncated file raises here, not later with half an image
        if img.mode not in ("RGB", "L"):
            img = img.convert("RGB")
    out = img.resize((size, size), Image.Resampling.BILINEAR, box=box)
    return out if out.mode == "RGB" else out.convert("RGB")


def _to_chw(img: Image.Image, flip: bool) -> torch.Tensor:
    """HWC RGB image -> contiguous uint8 CHW tensor; the horizontal flip rides on the same copy."""
    hwc = np.asarray(img)
    if flip:
        hwc = hwc[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))


def _check_size(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_range(name: str, pair: tuple[float, float]) -> None:
    if len(pair) != 2 or not 0 < pair[0] <= pair[1]:
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {pair!r}")


@dataclass(frozen=True)
class TrainTransform:
    """RandomResizedCrop (torchvision's sampling and fallback) then a horizontal flip, from record bytes.

    Randomness comes from Python's ``random`` module, which torch's DataLoader seeds in every worker.
    """

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    draft: bool = True

    def __post_init__(self) -> None:
        _check_size("size", self.size)
        _check_range("scale", self.scale)
        _check_range("ratio", self.ratio)
        if not 0.0 <= self.flip_p <= 1.0:
            raise ValueError(f"flip_p must be in [0, 1], got {self.flip_p!r}")
        warn_if_not_simd()

    def __call__(self, raw: bytes) -> torch.Tensor:
        img = _decode_crop(raw, self._box, self.size, self.draft)
        return _to_chw(img, random.random() < self.flip_p)

    def _box(self, width: int, height: int) -> Box:
        """torchvision's ``RandomResizedCrop.get_params``: 10 tries, then the center clamped to ``ratio``."""
        area = width * height
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target_area = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(log_low, log_high))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                top, left = random.randint(0, height - h), random.randint(0, width - w)
                return (left, top, left + w, top + h)
        w, h = width, height
        if width / height < self.ratio[0]:
            h = round(w / self.ratio[0])
        elif width / height > self.ratio[1]:
            w = round(h * self.ratio[1])
        top, left = (height - h) // 2, (width - w) // 2
        return (left, top, left + w, top + h)


@dataclass(frozen=True)
class EvalTransform:
    """Resize the shorter side to ``resize``, then center-crop ``size`` (torchvision Resize + CenterCrop)."""

    resize: int = 256
    size: int = 224
    draft: bool = True

    def __post_init__(self) -> None:
        _check_size("resize", self.resize)
        _check_size("size", self.size)
        if self.resize < self.size:
            raise ValueError(f"resize must be >= size, got resize={self.resize} and size={self.size}")
        warn_if_not_simd()

    def __call__(self, raw: bytes) -> torch.Tensor:
        return _to_chw(_decode_crop(raw, self._box, self.size, self.draft), flip=False)

    def _box(self, width: int, height: int) -> Box:
        """The center crop of the resized image, mapped back to the original image's coordinates."""
        if width <= height:
            new_w, new_h = self.resize, int(self.resize * height / width)
        else:
            new_w, new_h = int(self.resize * width / height), self.resize
        top, left = round((new_h - self.size) / 2), round((new_w - self.size) / 2)
        sx, sy = width / new_w, height / new_h
        return (left * sx, top * sy, (left + self.size) * sx, (top + self.size) * sy)


def make_transform(transform: str | Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``"train"`` or ``"eval"`` -> the default transform, a callable -> itself, None -> None."""
    if transform is None or callable(transform):
        return transform
    if transform == "train":
        return TrainTransform()
    if transform == "eval":
        return EvalTransform()
    raise ValueError(f'transform must be "train", "eval", a callable or None, got {transform!r}')


def tokens_to_tensor(raw: bytes) -> torch.Tensor:
    """The int64 tensor of a token sequence stored as little-endian int32 (how ArrowSource returns lists)."""
    return torch.from_numpy(np.frombuffer(raw, dtype="<i4").astype(np.int64))
