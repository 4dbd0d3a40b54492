"""The shape of the tree: ``loader/`` shows its ideas in folders, ``stallbench/`` uses only loader's faces and
flows one way, and modules stay short."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULES = sorted((REPO / "stallbench").rglob("*.py"))
LOADER_MODULES = sorted((REPO / "loader").rglob("*.py"))
MAX_LINES = 320
STYLE_LINES = 200
# Modules past the style's 200 lines (each still at most 320): a module that grows past 200 is split, or
# named here on purpose; one that shrinks back is taken off.
LONG = {
    "stallbench/analysis/whatif.py",
    "stallbench/conditions/cgroup.py",
    "stallbench/jobs/_timed.py",
    "stallbench/jobs/child.py",
    "stallbench/jobs/spec.py",
    "stallbench/analysis/results.py",  # plain dataclasses: the source of the JSON schema
    "stallbench/pytest_plugin.py",
    "stallbench/report/table.py",
    "stallbench/simulate.py",
    "stallbench/workloads.py",
    "loader/coordinated/member.py",
    "loader/coordinated/area.py",  # the group table's operations, each under the one lock
    "loader/cache/_store.py",  # a store attached: its files checked, what it holds and gave back, pickled
    "loader/cache/minio.py",  # the policy: get (bounds, identity, checksum), admit, reserve, first hit, limit
    "loader/serving/files.py",  # CachedFiles: roots listed, each read located, stat'ed, served or admitted
    "stallbench/cli/__init__.py",  # the parser, one option per call, and the checks across options
    "loader/dataloader/__init__.py",  # torch's signature and documented options, then each hook it takes over
    "loader/system/memory.py",  # the view: each cgroup level of v1 or v2 (limit, usage, file cache, kernel)
}


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


# What stallbench may use of loader: its public faces, each with the names its ``__all__`` lists, and the OS
# layer (``loader.system``) whole. Everything else is the loader's own, inside its idea folders.
FACES = ("loader", "loader.instrument", "loader.sources", "loader.packing")


def _exports(face: str) -> set[str]:
    """``__all__`` of ``face``, read from its source (no torch imported)."""
    path = REPO / Path(*face.split(".")) / "__init__.py"
    tree = ast.parse((path if path.exists() else path.parent.with_suffix(".py")).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{face} has no __all__")


def _public(dotted: str) -> bool:
    """A module stallbench may import: a face, or a module of the OS layer whose name has no underscore."""
    private = any(part.startswith("_") for part in dotted.split("."))
    return dotted in FACES or (dotted.split(".")[:2] == ["loader", "system"] and not private)


def _loader_uses(tree: ast.AST, exports: dict[str, set[str]]) -> Iterator[str]:
    """Each import from ``loader`` (and each ``loader.<name>`` in a module that does ``import loader``) that
    reaches past its faces: a module that is none, or a name its face does not export."""
    imported = any(
        isinstance(node, ast.Import) and any(a.name == "loader" and a.asname is None for a in node.names)
        for node in ast.walk(tree)
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "loader" and not _public(alias.name):
                    yield f"line {node.lineno}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "loader":
                continue
            for alias in node.names:
                face = node.module in exports
                named = f"{node.module}.{alias.name}"
                if (
                    not (face and alias.name in exports[node.module])
                    and not (_public(node.module) and not face and not alias.name.startswith("_"))
                    and not (node.module == "loader" and _public(named))
                ):
                    yield f"line {node.lineno}: from {node.module} import {alias.name}"
        elif (
            imported
            and isinstance(node, ast.Attribute)
            and getattr(node.value, "id", None) == "loader"
            and node.attr not in exports["loader"]
            and not _public(f"loader.{node.attr}")
        ):
            yield f"line {node.lineno}: loader.{node.attr}"


def test_the_faces_exports_are_read():
    exports = {face: _exports(face) for face in FACES}
    assert {"DataLoader", "ImageFolder", "CachedFiles"} <= exports["loader"]
    assert {"StatsBoard", "TimedCollate", "index_bytes", "split_share"} <= exports["loader.instrument"]
    assert not exports["loader.instrument"] & exports["loader"]  # what stallbench measures with, apart


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_stallbench_uses_only_loaders_faces(path: Path):
    uses = list(_loader_uses(ast.parse(path.read_text(), str(path)), {f: _exports(f) for f in FACES}))
    assert not uses, f"{_name(path)} reaches into loader's internals: {uses}"


def test_the_check_catches_what_is_no_face():
    code = "\n".join(
        [
            "import loader",
            "from loader.transport.collate import TimedCollate",  # 2: the module is no face
            "from loader.cache import _layout",  # 3
            "from loader import _pil, DataLoader, Hidden",  # 4: twice
            "import loader.resume.position",  # 5
            "loader.fetching",  # 6
            "loader.DataLoader",
            "from loader.instrument import TimedCollate, Hidden",  # 8: Hidden only
            "from loader.system.private import open_private",
            "from loader.system import _private",  # 10
            "from loader import system, instrument",
        ]
    )
    exports = {"loader": {"DataLoader"}, "loader.instrument": {"TimedCollate"}, "loader.sources": set()}
    exports["loader.packing"] = set()
    uses = list(_loader_uses(ast.parse(code), exports))
    assert sorted(int(use.split(":")[0].split()[1]) for use in uses) == [2, 3, 4, 4, 5, 6, 8, 10], uses


# loader's top level holds its public faces; each idea has a folder whose docstring says what it owns.
TOP_LEVEL = {"__init__.py", "datasets.py", "errors.py", "instrument.py"}


def test_loaders_top_level_holds_its_faces_and_each_idea_a_folder():
    assert {p.name for p in (REPO / "loader").glob("*.py")} == TOP_LEVEL
    folders = sorted(p for p in (REPO / "loader").iterdir() if p.is_dir() and p.name != "__pycache__")
    undocumented = [
        p.name for p in folders if not ast.get_docstring(ast.parse((p / "__init__.py").read_text()))
    ]
    assert not undocumented, f"folders whose __init__.py says nothing of what they own: {undocumented}"


def test_the_os_layer_and_the_instruments_split_import_without_torch():
    """A process that only counts, sizes or splits (stallbench's command line, a job's bootstrap, the storage
    reader) imports the modules it needs by their names, none loaded from a file by path."""
    code = (
        "import sys, loader.system.counters, loader.system.private\n"
        "from loader.instrument import split_share\n"
        "print(sorted(m for m in ('torch', 'numpy', 'pyarrow', 'lmdb') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.split() == ["[]"], done.stdout + done.stderr
    by_path = re.compile(r"spec_from_file_location|run_path\(|SourceFileLoader")
    # the one exception, for the bootstrap: a ``loader`` module in a user's process would shadow theirs
    assert [_name(p) for p in MODULES if by_path.search(p.read_text())] == ["stallbench/jobs/counters.py"]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_every_module_is_at_most_320_lines():
    long = {_name(p): _lines(p) for p in MODULES + LOADER_MODULES if _lines(p) > MAX_LINES}
    assert not long, f"split these modules (at most {MAX_LINES} lines): {long}"


def test_modules_past_200_lines_are_the_known_ones():
    past = {_name(p): _lines(p) for p in MODULES + LOADER_MODULES if _lines(p) > STYLE_LINES}
    assert set(past) == LONG, f"past {STYLE_LINES} lines now: {past}; named in LONG: {sorted(LONG)}"


# The flow of stallbench/: each layer imports only those after it (cli -> analysis -> jobs -> conditions).
LAYERS = ("cli", "report", "analysis", "jobs", "conditions")


def _imported(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


@pytest.mark.parametrize("layer", LAYERS[2:])
def test_no_import_runs_back_up_the_flow(layer):
    above = {f"stallbench.{name}" for name in LAYERS[: LAYERS.index(layer)]}
    back = {
        f"{_name(path)} imports {module}"
        for path in sorted((REPO / "stallbench" / layer).rglob("*.py"))
        for module in _imported(ast.parse(path.read_text()))
        if any(module == up or module.startswith(f"{up}.") for up in above)
    }
    assert not back, sorted(back)


# An option keeps one name from its flag to where it acts, and is resolved once into one value: the cold
# run's limits travel as one ``Limits``; only the flag, the value, the cgroup that enforces it and the
# report's record of it name the read throttle.
def test_the_read_throttle_is_named_in_four_files():
    name = re.compile(r"(?<![\w-])(?:storage_bandwidth|--storage-bandwidth)(?![\w-])")
    naming = sorted(_name(p) for p in (REPO / "stallbench").rglob("*.py") if name.search(p.read_text()))
    assert naming == [
        "stallbench/analysis/results.py",
        "stallbench/cli/__init__.py",
        "stallbench/conditions/cgroup.py",
        "stallbench/conditions/limits.py",
    ]


# One method for every job: a generated job is a command like the user's, started by ``run_command`` under a
# JobSpec and measured by the bootstrap. Its module is named as a command in one place (the plan's argv).
def test_a_generated_job_is_started_one_way():
    def names_workload(path: Path) -> bool:
        tree = ast.parse(path.read_text())
        return any(
            isinstance(node, ast.Constant) and node.value == "stallbench.jobs.workload"
            for node in ast.walk(tree)
        )

    assert sorted(_name(p) for p in MODULES if names_workload(p)) == ["stallbench/analysis/phases.py"]
