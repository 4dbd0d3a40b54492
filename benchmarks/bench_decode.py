"""Decode + train augmentation on one core: our TrainTransform (pillow-simd) vs the same steps, plain Pillow.

Plain Pillow and pillow-simd cannot share a venv, so the install step puts plain Pillow in
``.venv/plain-pillow`` (``pip install --target .venv/plain-pillow pillow==13.0.0``); set
STALLBENCH_PLAIN_PILLOW to use another folder. Both sides run ``_plain_pillow_decode.py`` as a subprocess
pinned to the same CPU with one thread, on the same generated JPEGs, in one benchmark group; each round
times COUNT decodes only (start-up and imports happen in the untimed setup).

    python -m pytest -p no:cacheprovider --benchmark-enable benchmarks/bench_decode.py -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("_plain_pillow_decode.py")
N_IMAGES, WIDTH, HEIGHT, QUALITY = 200, 500, 375, 90
COUNT = 400  # decodes per round: two passes over the images
MIN_RATIO = 1.5


@pytest.fixture
def pythonpath(mode: str) -> Path:
    """What the decode script runs with: the plain Pillow folder, or the repository for our loader."""
    if mode == "ours":
        return REPO
    path = Path(os.environ.get("STALLBENCH_PLAIN_PILLOW", REPO / ".venv" / "plain-pillow"))
    if not (path / "PIL" / "__init__.py").is_file():
        pytest.fail(
            f"plain Pillow not found in {path}: run scripts/install.sh (or `make install`), or "
            f"`pip install --target {path} pillow==13.0.0`, or set STALLBENCH_PLAIN_PILLOW to such a folder",
            pytrace=False,
        )
    return path


def _natural_jpeg(rng: np.random.Generator) -> Image.Image:
    """Smooth colour gradients (a coarse random grid, upsampled) plus sensor-like noise."""
    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC), dtype=np.float32)
    noisy = smooth + rng.normal(0.0, 8.0, smooth.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("decode-jpegs")
    rng = np.random.default_rng(0)
    for i in range(N_IMAGES):
        _natural_jpeg(rng).save(folder / f"{i:04d}.jpg", quality=QUALITY)
    return folder


@pytest.fixture(scope="module")
def rates() -> dict[str, float]:
    """Best images/s of each mode, filled by test_decode_rate and read by test_ratio."""
    return {}


def _start(mode: str, folder: Path, pythonpath: Path, cpu: int) -> subprocess.Popen:
    """Start the decode script and wait until it has imported everything and warmed up."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(pythonpath), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    command = [sys.executable, str(SCRIPT), str(folder), str(COUNT), mode, "--cpu", str(cpu), "--wait"]
    proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        pytest.fail(f"the {mode} decode script did not start (exit code {proc.wait()})", pytrace=False)
    return proc


def _decode(proc: subprocess.Popen) -> dict:
    """Let the started script decode (the timed part) and return its JSON result."""
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def _reap(procs: list[subprocess.Popen]) -> None:
    """Wait for the scripts to exit (torch's interpreter shutdown is slow: this stays out of the timing)."""
    for proc in procs:
        proc.stdin.close()  # a script still waiting for "go" then decodes once and exits
        returncode = proc.wait(timeout=60)
        proc.stdout.close()
        if returncode != 0:
            pytest.fail(f"a decode script failed with exit code {returncode}", pytrace=False)


@pytest.mark.parametrize("mode", ["plain", "ours"])
def test_decode_rate(pythonpath: Path, benchmark, jpeg_dir: Path, rates: dict[str, float], mode: str) -> None:
    cpu = max(os.sched_getaffinity(0))
    procs: list[subprocess.Popen] = []
    results: list[dict] = []

    def setup() -> tuple[tuple[subprocess.Popen], dict]:
        procs.append(_start(mode, jpeg_dir, pythonpath, cpu))
        return (procs[-1],), {}

    benchmark.group = "decode"
    try:
        benchmark.pedantic(lambda proc: results.append(_decode(proc)), setup=setup, rounds=3, iterations=1)
    finally:
        _reap(procs)
    if mode == "plain" and not Path(results[0]["pil_path"]).is_relative_to(pythonpath):
        pytest.fail(f"the plain run imported PIL from {results[0]['pil_path']}, not from {pythonpath}")
    rates[mode] = max(r["images_per_s"] for r in results)
    benchmark.extra_info.update(
        images_per_s=rates[mode],
        rounds_images_per_s=[r["images_per_s"] for r in results],
        pil=results[0]["pil"],
    )


def test_ratio(rates: dict[str, float]) -> None:
    if set(rates) != {"plain", "ours"}:
        pytest.skip("needs test_decode_rate[plain] and test_decode_rate[ours] in the same run")
    ratio = rates["ours"] / rates["plain"]
    summary = (
        f"ours {rates['ours']:.0f} images/s, plain Pillow {rates['plain']:.0f} images/s, ratio {ratio:.2f}"
    )
    print(f"\ndecode on one core: {summary}")
    assert ratio >= MIN_RATIO, f"decode speed-up below {MIN_RATIO}: {summary}"
