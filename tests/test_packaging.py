"""Packaging: `make bench` collects every benchmark; `pip install .` brings everything the code imports."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("loader", "stallbench")
# Import names that are not their distribution's name; any other import is its own distribution's name.
DISTRIBUTIONS = {
    "PIL": "pillow",
    "yaml": "pyyaml",
    "cv2": "opencv-python",
    "sklearn": "scikit-learn",
    "pynvml": "nvidia-ml-py",
}
NOT_PINNED = {"pillow"}  # scripts/install.sh builds pillow-simd in its place


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def makefile_recipe(target: str) -> list[str]:
    """The command lines of ``target`` in the Makefile."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def bench_pytest_args() -> list[str]:
    """The arguments ``make bench`` gives pytest (after ``$(PY) -m pytest``)."""
    (line,) = [cmd for cmd in makefile_recipe("bench") if "-m pytest" in cmd]
    return shlex.split(line.split("-m pytest", 1)[1])


def test_make_bench_collects_every_benchmark_file() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    cmd = [sys.executable, "-m", "pytest", *bench_pytest_args(), "--collect-only", "-q"]
    done = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = {line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line}
    files = {str(p.relative_to(REPO)) for p in (REPO / "benchmarks").glob("bench_*.py")}
    assert files and collected == files


# Imports of a module that only its importer ever loads: pytest loads the plugin (entry point pytest11).
LOADED_BY = {"pytest": {"stallbench/pytest_plugin.py"}}


def third_party_imports() -> dict[str, set[str]]:
    """Top-level modules imported under loader/ and stallbench/ that are neither stdlib nor ours: files."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {name.split(".")[0] for name in names}:
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def declared_dependencies() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {normalise(re.match(r"[A-Za-z0-9._-]+", req)[0]) for req in project["dependencies"]}


def optional_dependencies() -> set[str]:
    """Distributions of the optional extras (``pip install .[gpu]``): imported only where installed."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {normalise(re.match(r"[A-Za-z0-9._-]+", req)[0]) for reqs in extras.values() for req in reqs}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    imports = third_party_imports()
    assert {"torch", "PIL", "tqdm", "matplotlib"} <= set(imports)  # the scan sees the imports
    declared = declared_dependencies() | optional_dependencies()
    missing = {
        name: sorted(files)
        for name, files in imports.items()
        if normalise(DISTRIBUTIONS.get(name, name)) not in declared and files != LOADED_BY.get(name)
    }
    assert not missing, f"imported but not in pyproject.toml dependencies or extras: {missing}"


def test_every_dependency_is_pinned_for_ci() -> None:
    lines = (REPO / "requirements-ci.txt").read_text().splitlines()
    pinned = {normalise(line.split("==")[0]) for line in lines if "==" in line and not line.startswith("#")}
    unpinned = declared_dependencies() - NOT_PINNED - pinned
    assert not unpinned, f"in pyproject.toml but not pinned (==) in requirements-ci.txt: {sorted(unpinned)}"
