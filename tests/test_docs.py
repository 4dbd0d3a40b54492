"""The examples in the docs run as written."""

from __future__ import annotations

import gc
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


@pytest.mark.slow
@pytest.mark.multiproc
def test_the_hyperparameter_search_example_runs_as_one_trial(tmp_path):
    from tests.helpers import make_jpeg_folder

    (block,) = python_blocks(DOCS / "how-to" / "hyperparameter-search.md")
    root = make_jpeg_folder(tmp_path / "train")
    code = block.replace('"/data/train"', repr(str(root))).replace("search-42", f"docs-{tmp_path.name}")
    namespace: dict = {}
    exec(compile(code, "hyperparameter-search.md", "exec"), namespace)
    stats = namespace["train"].stats().coordination
    batches = 2 * len(namespace["train"])
    assert (stats.status, stats.batches_prepared, stats.batches_consumed) == ("member", batches, batches)
    area = namespace["train"]._coordinated.area.path
    namespace.clear()
    gc.collect()  # the trial's end: the last member out removes the staging area
    assert not area.exists()
