"""The shape of ``stallbench/``: it uses only what ``loader`` exports, and its modules stay short."""

from __future__ import annotations

import ast
import re
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
    "loader/files.py",  # CachedFiles: roots listed, each read located, stat'ed, served or read and admitted
    "stallbench/cli/__init__.py",  # the parser, one option per call, and the checks across options
    "loader/dataloader.py",  # torch's signature and documented options, then each torch hook it takes over
    "loader/system/memory.py",  # the view: each cgroup level of v1 or v2 (limit, usage, file cache, kernel)
}


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def _loader_exports() -> set[str]:
    """``loader.__all__``, read from its source (no torch imported)."""
    tree = ast.parse((REPO / "loader" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("loader/__init__.py has no __all__")


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def _loader_uses(tree: ast.AST, exports: set[str]) -> Iterator[str]:
    """Each import from ``loader`` (and each ``loader.<name>`` in a module that does ``import loader``) that
    reaches past what it exports: a private module or name, or a top-level name not in ``loader.__all__``."""
    imported = any(
        isinstance(node, ast.Import) and any(a.name == "loader" and a.asname is None for a in node.names)
        for node in ast.walk(tree)
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "loader" and _private(alias.name):
                    yield f"line {node.lineno}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "loader":
                continue
            for alias in node.names:
                hidden = _private(node.module) or alias.name.startswith("_")
                if hidden or (node.module == "loader" and alias.name not in exports):
                    yield f"line {node.lineno}: from {node.module} import {alias.name}"
        elif (
            imported
            and isinstance(node, ast.Attribute)
            and getattr(node.value, "id", None) == "loader"
            and node.attr not in exports
        ):
            yield f"line {node.lineno}: loader.{node.attr}"


def test_loader_exports_are_read():
    assert {"DataLoader", "ImageFolder", "CachedFiles"} <= _loader_exports()
    internals = {"TimedCollate", "StatsBoard", "index_bytes", "open_private", "reserve_for_limit"}
    assert not internals & _loader_exports()  # stallbench takes them from loader.system, .board, .cache


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_stallbench_uses_only_what_loader_exports(path: Path):
    uses = list(_loader_uses(ast.parse(path.read_text(), str(path)), _loader_exports()))
    assert not uses, f"{_name(path)} reaches into loader's internals: {uses}"


def test_the_check_catches_private_imports():
    code = "\n".join(
        [
            "import loader",
            "from loader._collate import TimedCollate",
            "from loader.cache import _layout",
            "from loader import _pil, DataLoader, Hidden",
            "import loader._resume",
            "loader._pil",
            "loader.DataLoader",
        ]
    )
    uses = list(_loader_uses(ast.parse(code), {"DataLoader"}))
    assert [use.split(":")[0] for use in uses] == [f"line {n}" for n in (2, 3, 4, 4, 5, 6)], uses


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
