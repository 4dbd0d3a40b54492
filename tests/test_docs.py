"""The examples in the docs run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def python_blocks(doc: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)


@pytest.mark.slow
@pytest.mark.multiproc
def test_getting_started_runs(tmp_path, monkeypatch, shm_dir):
    blocks = python_blocks(DOCS / "getting-started.md")
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    code = "\n".join(blocks).replace('cache_dir="/dev/shm"', f'cache_dir="{shm_dir}"')
    namespace: dict = {}
    exec(compile(code, "getting-started.md", "exec"), namespace)
    assert namespace["stats"].records_cached == 64
