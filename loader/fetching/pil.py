"""Which PIL build is active: pillow-simd (fast resize) or plain Pillow, and its JPEG library."""

from __future__ import annotations

import functools
import importlib.metadata
import warnings
from dataclasses import dataclass

import PIL
import PIL.features

__all__ = ["PilBuild", "SlowDecodeWarning", "pil_build", "warn_if_not_simd"]


class SlowDecodeWarning(UserWarning):
    """Image decode runs on plain Pillow, which resizes several times slower than pillow-simd."""


@dataclass(frozen=True)
class PilBuild:
    """The distribution that provides the imported ``PIL`` package."""

    distribution: str  # "pillow-simd" or "Pillow"
    version: str
    simd: bool
    jpeg: str  # e.g. "libjpeg-turbo 2.1.5", "libjpeg 9", or "none"


def _distribution(version: str) -> str:
    """Name the distribution of the imported PIL; when several claim it, the one whose version matches."""
    names = sorted(set(importlib.metadata.packages_distributions().get("PIL", [])))
    matching = [name for name in names if importlib.metadata.version(name) == version]
    if len(matching) == 1:
        return "pillow-simd" if matching[0].lower() == "pillow-simd" else "Pillow"
    return "pillow-simd" if ".post" in version else "Pillow"  # pillow-simd's releases end in ".postN"


def _jpeg_library() -> str:
    if PIL.features.check_feature("libjpeg_turbo"):
        return f"libjpeg-turbo {PIL.features.version_feature('libjpeg_turbo')}"
    if PIL.features.check_codec("jpg"):
        return f"libjpeg {PIL.features.version_codec('jpg')}"
    return "none"


@functools.cache
def pil_build() -> PilBuild:
    """Describe the active PIL build (cached: it cannot change within a process)."""
    distribution = _distribution(PIL.__version__)
    return PilBuild(distribution, PIL.__version__, distribution == "pillow-simd", _jpeg_library())


@functools.cache
def warn_if_not_simd() -> None:
    """Warn once per process when decode runs on plain Pillow."""
    build = pil_build()
    if not build.simd:
        warnings.warn(
            f"image decode uses plain {build.distribution} {build.version}, which resizes several times "
            "slower than pillow-simd; run scripts/install.sh (or `make install`) to replace it",
            SlowDecodeWarning,
            stacklevel=2,
        )
