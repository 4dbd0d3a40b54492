"""Packaging: `make bench` collects every benchmark; `pip install .` brings everything the code imports."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
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
    "streaming": "mosaicml-streaming",
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
    env = {  # as `make bench` runs, whether or not this suite runs under pytest-xdist
        **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
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


def readme_pip_installs() -> list[list[str]]:
    """The ``pip install`` lines of the README's install block, as argv (from ``pip`` on)."""
    lines = [line.split("#")[0].strip() for line in (REPO / "README.md").read_text().splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("pip install ")]


def installed_without_dependencies() -> set[str]:
    """Distributions the README installs with ``--no-deps`` (they declare torchvision)."""
    named = [arg for argv in readme_pip_installs() if "--no-deps" in argv for arg in argv[2:]]
    return {normalise(arg.split("==")[0]) for arg in named if not arg.startswith("-")}


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
    declared = declared_dependencies() | optional_dependencies() | installed_without_dependencies()
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


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_readme_s_pip_install_gives_working_frameworks_without_torchvision(tmp_path) -> None:
    """Issue 46: ``pip install .[test]`` pulled torchvision (LitData declares it), which does not import
    beside the pinned torch, and then Lightning and transformers' Trainer failed to import. The README's
    commands in a fresh venv, as written (``--no-compile``: no bytecode written ahead, the same packages)."""
    commands = readme_pip_installs()
    assert len(commands) == 2 and "torch==2.13.0" in commands[0] and installed_without_dependencies()
    venv = tmp_path / "venv"
    try:
        _install_and_check(venv, commands, tmp_path)
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # ~2 GB


def _install_and_check(venv: Path, commands: list[list[str]], cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    for argv in commands:
        cmd = [python, "-m", *argv, "--no-compile", "-q", "--disable-pip-version-check"]
        done = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True, timeout=900)
        assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    probe = (
        "import importlib.util, torch, pytorch_lightning, accelerate, datasets, litdata, webdataset, moto\n"
        "from transformers import Trainer\n"
        "import loader, stallbench\n"
        "from stallbench.jobs.streaming_import import streaming\n"
        "assert streaming().StreamingDataset\n"
        "print(torch.__version__, importlib.util.find_spec('torchvision') is None)"
    )
    done = subprocess.run([python, "-c", probe], cwd=cwd, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["2.13.0+cpu", "True"]
    cli = subprocess.run([str(venv / "bin" / "stallbench"), "--help"], text=True, capture_output=True)
    assert cli.returncode == 0 and "analyze" in cli.stdout
