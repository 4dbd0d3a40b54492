"""The image operations behind ``loader.fetching.decode``'s transforms: decode (whole, or at a draft scale
for a crop), crop and resize in one step, and the CHW tensor.

The crop is chosen in the coordinates of the encoded image before anything is decoded, so a JPEG can be
decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, ``Image.draft``) whenever the crop keeps at least
the output size, and the crop and resize are one ``Image.resize(..., box=...)``.
"""

from __future__ import annotations

import contextlib
import io
import struct
from collections.abc import Callable, Iterator

import numpy as np
import torch
from PIL import Image, JpegImagePlugin

__all__ = ["Box", "crop", "decode_crop", "decode_whole", "draft_box", "to_chw"]

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


def draft_box(img: Image.Image, box: Box, size: int) -> Box:
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


def decode_crop(raw: bytes, box_for: Callable[[int, int], Box], size: int, draft: bool) -> Image.Image:
    """Decode ``raw``, then resize the box ``box_for(width, height)`` picks to ``size`` x ``size`` RGB."""
    with _decode_errors(raw):
        img = Image.open(io.BytesIO(raw))
        box = box_for(*img.size)
        if draft:
            box = draft_box(img, box, size)
        img = _loaded(img)
    return crop(img, box, size)


def _loaded(img: Image.Image) -> Image.Image:
    img.load()  # a truncated file raises here, not later with half an image
    return img if img.mode in ("RGB", "L") else img.convert("RGB")


def crop(img: Image.Image, box: Box, size: int) -> Image.Image:
    out = img.resize((size, size), Image.Resampling.BILINEAR, box=box)
    return out if out.mode == "RGB" else out.convert("RGB")


def decode_whole(raw: bytes) -> Image.Image:
    """The decoded image at full size, RGB or grey: a train record prepared is its array."""
    with _decode_errors(raw):
        return _loaded(Image.open(io.BytesIO(raw)))


def to_chw(img: Image.Image, flip: bool) -> torch.Tensor:
    """HWC RGB image -> contiguous uint8 CHW tensor; the horizontal flip rides on the same copy."""
    hwc = np.asarray(img)
    if flip:
        hwc = hwc[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))
