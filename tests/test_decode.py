"""Tests for loader.fetching.decode (transforms from record bytes) and loader.fetching.pil (which PIL build is
active)."""

from __future__ import annotations

import importlib.metadata
import io
import random

import numpy as np
import PIL
import pytest
import torch
from PIL import Image

import loader.fetching.pil as pil_module
from loader.fetching.decode import EvalTransform, TrainTransform, make_transform
from loader.fetching.images import draft_box as _draft
from loader.fetching.pil import PilBuild, SlowDecodeWarning, pil_build, warn_if_not_simd


def _picture(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients with mild noise, asymmetric left to right: an HWC uint8 array."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / 37 + y / 53)], axis=-1)
    rgb += np.random.default_rng(seed).normal(0, 4, rgb.shape)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def _encode(width: int, height: int, mode: str = "RGB", fmt: str = "JPEG") -> bytes:
    out = io.BytesIO()
    Image.fromarray(_picture(width, height)).convert(mode).save(out, fmt, quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def big_jpeg() -> bytes:
    return _encode(1600, 1200)


INPUTS = [
    (100, 80, "RGB", "JPEG"),
    (500, 375, "RGB", "JPEG"),
    (1600, 1200, "RGB", "JPEG"),
    (300, 200, "L", "JPEG"),
    (300, 200, "CMYK", "JPEG"),
    (300, 200, "RGBA", "PNG"),
    (120, 400, "P", "PNG"),
]


@pytest.mark.parametrize(("width", "height", "mode", "fmt"), INPUTS)
@pytest.mark.parametrize("transform", [TrainTransform(), EvalTransform()], ids=["train", "eval"])
def test_output_is_contiguous_uint8_chw(transform, width: int, height: int, mode: str, fmt: str) -> None:
    out = transform(_encode(width, height, mode, fmt))
    assert out.shape == (3, 224, 224)
    assert out.dtype == torch.uint8
    assert out.is_contiguous()
    if mode == "L":
        assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])


def test_flip_happens_sometimes_not_always() -> None:
    raw = _encode(240, 240, fmt="PNG")
    whole = {"scale": (1.0, 1.0), "ratio": (1.0, 1.0)}  # the crop is the whole image: only the flip varies
    plain = TrainTransform(**whole, flip_p=0.0)(raw)
    mirrored = TrainTransform(**whole, flip_p=1.0)(raw)
    assert torch.equal(mirrored, plain.flip(2)) and not torch.equal(mirrored, plain)
    random.seed(0)
    outs = [TrainTransform(**whole)(raw) for _ in range(40)]
    flips = sum(torch.equal(out, mirrored) for out in outs)
    assert sum(torch.equal(out, plain) for out in outs) + flips == 40
    assert 8 <= flips <= 32


def test_crop_varies_across_calls_and_follows_the_seed() -> None:
    raw, transform = _encode(500, 375), TrainTransform(flip_p=0.0)
    outs = [transform(raw) for _ in range(6)]
    assert len({out.numpy().tobytes() for out in outs}) >= 5
    random.seed(7)
    first = transform(raw)
    random.seed(7)
    assert torch.equal(first, transform(raw))


def test_random_boxes_stay_inside_scale_and_ratio() -> None:
    transform = TrainTransform()
    random.seed(3)
    for _ in range(300):
        left, top, right, bottom = transform._box(500, 375)
        w, h = right - left, bottom - top
        assert 0 <= left < right <= 500 and 0 <= top < bottom <= 375
        assert 0.07 <= w * h / (500 * 375) <= 1.0
        assert 3 / 4 - 0.05 <= w / h <= 4 / 3 + 0.05


def test_fallback_is_the_center_crop_clamped_to_ratio() -> None:
    transform = TrainTransform(scale=(2.0, 2.0))  # every try is too big: torchvision's fallback
    assert transform._box(1000, 100) == (433, 0, 566, 100)
    assert transform._box(100, 1000) == (0, 433, 100, 566)
    assert transform._box(400, 300) == (0, 0, 400, 300)


def test_eval_is_deterministic_and_matches_resize_then_center_crop() -> None:
    raw, transform = _encode(500, 375), EvalTransform(draft=False)
    state = random.getstate()
    out = transform(raw)
    assert torch.equal(out, transform(raw))
    assert random.getstate() == state
    resized = Image.open(io.BytesIO(raw)).resize((341, 256), Image.Resampling.BILINEAR)
    left, top = round((341 - 224) / 2), round((256 - 224) / 2)
    expected = np.asarray(resized.crop((left, top, left + 224, top + 224))).transpose(2, 0, 1)
    assert np.abs(out.numpy().astype(int) - expected).mean() < 1.5


def test_draft_decodes_large_jpeg_at_reduced_scale(big_jpeg: bytes) -> None:
    img = Image.open(io.BytesIO(big_jpeg))
    box = _draft(img, (100.0, 100.0, 1100.0, 1000.0), 224)  # a 1000x900 crop allows 1/4 scale
    assert img.size == (400, 300)
    assert box == (25.0, 25.0, 275.0, 250.0)


@pytest.mark.parametrize("kind", ["train", "eval"])
def test_draft_output_is_close_to_full_decode(big_jpeg: bytes, kind: str) -> None:
    cls = TrainTransform if kind == "train" else EvalTransform
    for seed in range(4):
        random.seed(seed)
        fast = cls()(big_jpeg)
        random.seed(seed)
        full = cls(draft=False)(big_jpeg)
        assert (fast.float() - full.float()).abs().mean() < 1.5


def test_make_transform_by_name() -> None:
    assert isinstance(make_transform("train"), TrainTransform)
    assert isinstance(make_transform("eval"), EvalTransform)
    assert make_transform(None) is None
    assert make_transform(len) is len
    for bad in ("Train", 3):
        with pytest.raises(ValueError, match=r'"train", "eval", a callable or None'):
            make_transform(bad)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TrainTransform(size=0),
        lambda: TrainTransform(scale=(0.5, 0.1)),
        lambda: TrainTransform(ratio=(0.0, 1.0)),
        lambda: TrainTransform(flip_p=1.5),
        lambda: EvalTransform(resize=200, size=224),
    ],
)
def test_bad_arguments_raise(make) -> None:
    with pytest.raises(ValueError, match="must"):
        make()


@pytest.mark.parametrize("transform", [TrainTransform(), EvalTransform()], ids=["train", "eval"])
def test_corrupt_input_raises_value_error(transform, big_jpeg: bytes) -> None:
    small = _encode(500, 375)
    png = _encode(300, 200, fmt="PNG")
    rubbish = np.random.default_rng(0).bytes(5000)
    for raw in (small[: len(small) // 2], big_jpeg[: len(big_jpeg) // 2], png[: len(png) // 2], rubbish, b""):
        with pytest.raises(ValueError, match="cannot decode image"):
            transform(raw)


def test_pil_build_agrees_with_package_metadata() -> None:
    build = pil_build()
    names = importlib.metadata.packages_distributions()["PIL"]
    assert build.distribution.lower() in {name.lower() for name in names}
    assert importlib.metadata.version(build.distribution) == build.version == PIL.__version__
    assert build.simd == (build.distribution == "pillow-simd")
    assert build.jpeg.startswith("libjpeg")
    if len(names) == 1:
        assert build.distribution.lower() == names[0].lower()


def test_pil_build_picks_the_matching_distribution_when_both_are_listed(monkeypatch) -> None:
    versions = {"Pillow": "12.1.1", "pillow-simd": "12.1.1.post0"}
    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: {"PIL": list(versions)})
    monkeypatch.setattr(importlib.metadata, "version", versions.__getitem__)
    assert pil_module._distribution("12.1.1.post0") == "pillow-simd"
    assert pil_module._distribution("12.1.1") == "Pillow"
    assert pil_module._distribution("11.0.0.post1") == "pillow-simd"  # no match: the ".postN" suffix decides


def test_warns_once_on_plain_pillow(monkeypatch) -> None:
    plain = PilBuild("Pillow", "13.0.0", simd=False, jpeg="libjpeg-turbo 3.2.0")
    monkeypatch.setattr(pil_module, "pil_build", lambda: plain)
    warn_if_not_simd.cache_clear()
    try:
        with pytest.warns(SlowDecodeWarning, match="install.sh") as record:
            warn_if_not_simd()
            warn_if_not_simd()
        assert len(record) == 1
    finally:
        warn_if_not_simd.cache_clear()
