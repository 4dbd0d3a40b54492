"""The shape of the tree: ``loader/`` shows its ideas in folders, ``stallbench/`` uses only loader's faces and
flows one way, and no two ideas import each other."""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULES = sorted((REPO / "stallbench").rglob("*.py"))


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
TOP_LEVEL = {"__init__.py", "datasets.py", "errors.py", "instrument.py", "_lazy.py"}  # _lazy: the faces' own


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


def _unit(dotted: str) -> str:
    """The idea a module belongs to: its package's folder (``loader.form``) or the top module itself."""
    return ".".join(dotted.split(".")[:2])


def _is_module(dotted: str) -> bool:
    path = REPO / Path(*dotted.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def _run_time_imports(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (names for the type checker, never imported)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _idea_graph(package: str) -> dict[str, dict[str, str]]:
    """Which idea imports which inside ``package`` (every import, in a function too), with one place each
    edge is made; the package's own ``__init__`` (a face that names each thing when first used) left out."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        me = _unit(".".join(parts))
        for node in _run_time_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
                modules = [n if _is_module(n) else node.module for n in names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                to = _unit(module)
                if module.split(".")[0] == package and to not in (me, package):
                    graph.setdefault(me, {}).setdefault(to, f"{_name(path)}:{node.lineno}")
    return graph


def _a_circle(graph: dict[str, dict[str, str]]) -> list[str]:
    """One circle of ``graph`` (the ideas on it, the first again at the end), or none."""
    state: dict[str, int] = {}  # 1: on the path walked now, 2: done

    def walk(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in graph.get(node, {}):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := walk(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := walk(start, [start])):
            return found
    return []


@pytest.mark.parametrize("package", ["loader", "stallbench"])
def test_no_two_ideas_import_each_other(package):
    """An idea (a folder, or a top module) that imports another is never imported back by it, however
    far round: each can be read knowing only the ones it names."""
    graph = _idea_graph(package)
    circle = _a_circle(graph)
    assert not circle, [f"{a} -> {b} ({graph[a][b]})" for a, b in itertools.pairwise(circle)]


def test_the_circle_check_finds_a_circle_however_far_round():
    assert _a_circle({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == ["a", "b", "c", "a"]
    assert _a_circle({"a": {"b": ""}, "b": {"c": ""}, "d": {"a": ""}}) == []


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
