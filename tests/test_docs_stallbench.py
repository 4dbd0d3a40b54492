"""The stallbench reference and the find-your-stall how-to: their examples run, and they cover every option.

In these pages a ```python block runs as written, and a ```console block runs each ``$ python -m stallbench
...`` line (only cheap subcommands: ``--help`` and ``simulate``), checks exit code 0, and checks that every
output line shown is in the real output (trimmed lines are allowed). Longer commands go in ```bash blocks,
which are documented but not run.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stallbench.cli import make_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
REFERENCE = DOCS / "stallbench.md"
HOW_TO = DOCS / "how-to" / "find-your-stall.md"
CHEAP = {"--help", "simulate"}


def blocks(doc: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", doc.read_text(), flags=re.S | re.M)


def console_commands(doc: Path) -> list[tuple[str, list[str]]]:
    """``(command, output lines shown)`` for each ``$ `` line of the page's console blocks."""
    commands: list[tuple[str, list[str]]] = []
    for block in blocks(doc, "console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands and line.strip():
                commands[-1][1].append(line.strip())
    return commands


def run_cli(command: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "stallbench"], command
    assert argv[3] in CHEAP, f"{command!r} is not cheap: document it in a ```bash block"
    env = {
        **os.environ,
        "COLUMNS": "100",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, *argv[1:]], cwd=cwd, env=env, text=True, capture_output=True, timeout=120
    )


def exec_page(doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **replace: str) -> dict:
    code = "\n".join(blocks(doc, "python"))
    for old, new in replace.items():
        assert old in code
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    exec(compile(code, str(doc), "exec"), namespace)
    return namespace


def test_reference_python_examples_run(tmp_path, monkeypatch, capsys):
    ns = exec_page(REFERENCE, tmp_path, monkeypatch)
    assert (tmp_path / "profile.json").is_file()
    assert ns["steady"]["wait_fraction"] is not None
    assert "steady state: 14 batches" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.multiproc
def test_how_to_python_examples_run(tmp_path, monkeypatch):
    ns = exec_page(HOW_TO, tmp_path, monkeypatch)  # its cache in this session's default home
    assert ns["steady"]["wait_fraction"] > 0.5
    assert ns["dl"].stats().hits > 0
    assert ns["build"].distribution in ("pillow", "pillow-simd")


@pytest.mark.slow
@pytest.mark.parametrize("doc", [REFERENCE, HOW_TO], ids=lambda d: d.name)
def test_console_examples_run_and_show_real_output(doc, tmp_path):
    commands = console_commands(doc)
    assert commands
    for command, shown in commands:
        done = run_cli(command, tmp_path)
        assert done.returncode == 0, (command, done.stderr)
        real = {line.strip() for line in done.stdout.splitlines()}
        missing = [line for line in shown if line not in real]
        assert not missing, f"{command!r} does not print {missing}"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_reference_documents_every_subcommand_and_option():
    text = REFERENCE.read_text()
    headings = "\n".join(re.findall(r"^##+ .*$", text, flags=re.M))
    for name, sub in _subparsers(make_parser()).items():
        assert f"`{name}`" in headings, name
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or "-h" in action.option_strings:
                continue
            assert f"`{action.option_strings[-1]}" in text, f"{name} {action.option_strings[-1]}"
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 130 |"):
        assert code in text


@pytest.mark.parametrize("doc", [REFERENCE, HOW_TO], ids=lambda d: d.name)
def test_relative_links_resolve(doc):
    for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", doc.read_text()):
        assert (doc.parent / target).is_file(), target
