"""Image transforms without torchvision, record bytes -> uint8 CHW RGB tensor (the operations:
``loader.fetching.images``).

Both transforms are staged (``loader.fetching.staged``): ``"train"`` prepares the decoded pixels at full size
and augments them with the random crop and flip; ``"eval"`` prepares the whole output. A prepared record skips
the draft decode: a train sample made from one equals ``TrainTransform(draft=False)``'s bit for bit, and
differs from the drafted one only where the draft scaled the decode (same crop, same flip; see
docs/concepts/prepared-cache.md for the bound).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from loader.fetching.images import Box, crop, decode_crop, decode_whole, to_chw
from loader.fetching.pil import warn_if_not_simd
from loader.fetching.staged import StagedTransform

__all__ = ["EvalTransform", "TrainTransform", "make_transform", "tokens_to_tensor"]


def _check_size(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_range(name: str, pair: tuple[float, float]) -> None:
    if len(pair) != 2 or not 0 < pair[0] <= pair[1]:
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {pair!r}")


@dataclass(frozen=True)
class TrainTransform(StagedTransform):
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
        img = decode_crop(raw, self._box, self.size, self.draft)
        return to_chw(img, random.random() < self.flip_p)

    identity = "decoded pixels"  # prepare has no setting: every TrainTransform shares its records

    def prepare(self, raw: bytes) -> np.ndarray:
        return np.asarray(decode_whole(raw))

    def augment(self, pixels: np.ndarray) -> torch.Tensor:
        return self._crop_flip(Image.fromarray(pixels))

    def prepare_augment(self, raw: bytes) -> tuple[np.ndarray, torch.Tensor]:
        """The crop is taken from the decoded image itself: ``augment`` would first copy the array back
        into one (~150 us of a 500x375 record's ~2 ms miss)."""
        img = decode_whole(raw)
        return np.asarray(img), self._crop_flip(img)

    def _crop_flip(self, img: Image.Image) -> torch.Tensor:
        img = crop(img, self._box(*img.size), self.size)
        return to_chw(img, random.random() < self.flip_p)

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
class EvalTransform(StagedTransform):
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
        return to_chw(decode_crop(raw, self._box, self.size, self.draft), flip=False)

    @property
    def identity(self) -> str:  # type: ignore[override]
        return f"EvalTransform(resize={self.resize}, size={self.size}, draft={self.draft})"

    prepare = __call__  # all of it is deterministic

    def augment(self, prepared: torch.Tensor) -> torch.Tensor:
        return prepared

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
