#!/usr/bin/env bash
# Makes the virtual environment (default .venv) with pinned dependencies and leaves pillow-simd active as PIL.
# Safe to run again: it does the work once and then only checks. Usage: scripts/install.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
stamp="$venv/.installed-$(sha1sum requirements-ci.txt scripts/install.sh pyproject.toml | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  exit 0
fi

if ! [ -e /usr/include/jpeglib.h ] || ! [ -e /usr/include/zlib.h ]; then
  echo "install: pillow-simd builds from source and needs libjpeg and zlib headers; installing them" >&2
  apt-get update -qq && apt-get install -y -qq libjpeg62-turbo-dev zlib1g-dev >/dev/null
fi

python3 -m venv "$venv"
pip="$venv/bin/python -m pip --disable-pip-version-check -q"
# torch==2.13.0 is pinned here: it installs the CPU build from this machine's disk in seconds.
$pip install -r requirements-ci.txt
# LitData and MosaicML Streaming, loaders `stallbench compare --loaders litdata,streaming` runs beside ours:
# each declares torchvision, which does not import beside this torch and which neither uses for what we run,
# so they go in without it (Streaming's other dependencies are in requirements-ci.txt).
$pip install --no-deps litdata==0.2.76 obstore==0.12.1 tifffile==2026.3.3 mosaicml-streaming==0.13.0
$pip install --no-deps -e .

# Anything above may have pulled Pillow (matplotlib does); both install as PIL and the last one wins.
# Remove Pillow and build pillow-simd last, with AVX2 where the CPU has it.
$pip uninstall -y pillow pillow-simd >/dev/null 2>&1 || true
simd_flags=""
if grep -qw avx2 /proc/cpuinfo; then simd_flags="-mavx2"; fi
CC="cc $simd_flags" $pip install --no-cache-dir --no-binary pillow-simd "pillow-simd==12.1.1.post0"

# Plain Pillow, kept apart, only for the decode benchmark's baseline.
$pip install --no-deps --target "$venv/plain-pillow" "pillow==13.0.0"

"$venv/bin/python" -c "
import loader, sys
build = loader.pil_build()
print('install: PIL build active:', build)
sys.exit(0 if build.simd else 'install: pillow-simd is not the active PIL build')
"
rm -f "$venv"/.installed-*
touch "$stamp"
