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
    stats = namespace["stats"]  # the form "auto" chose holds what fits; the second epoch hits all of it
    assert stats.cache_form in ("raw", "prepared", "mixed") and stats.hits == stats.records_cached > 0


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


@pytest.mark.multiproc
def test_the_own_dataset_example_serves_its_second_epoch_from_the_cache(tmp_path, shm_dir, capsys):
    from PIL import Image

    (block,) = python_blocks(DOCS / "how-to" / "your-own-dataset.md")
    root = tmp_path / "digits"
    for i in range(20):
        (root / str(i % 10)).mkdir(parents=True, exist_ok=True)
        Image.new("L", (8, 8), color=i * 10).save(root / str(i % 10) / f"{i}.jpg")
    code = block.replace('"/data/digits"', repr(str(root)))
    code = code.replace('cache_bytes="auto",', f'cache_bytes="auto", cache_dir={str(shm_dir)!r},')
    assert code.count(str(root)) == 2 and str(shm_dir) in code
    namespace: dict = {}
    exec(compile(code, "your-own-dataset.md", "exec"), namespace)
    assert capsys.readouterr().out == "hits 20, misses 20, cached 20 files\n"


def test_the_staged_transform_example_prepares_once_and_augments_each_time():
    import io

    from PIL import Image

    from loader.fetching.staged import is_staged

    (block,) = python_blocks(DOCS / "concepts" / "prepared-cache.md")
    namespace: dict = {}
    exec(compile(block, "prepared-cache.md", "exec"), namespace)
    transform = namespace["transform"]
    buf = io.BytesIO()
    Image.new("L", (8, 6), color=90).save(buf, format="PNG")
    prepared = transform.prepare(buf.getvalue())
    assert is_staged(transform) and transform.identity == "grey decode v1"
    assert prepared.shape == (6, 8) and transform(buf.getvalue()).tolist() == [[90] * 8] * 6


@pytest.mark.multiproc
def test_the_slow_samples_example_gives_every_sample_once_an_epoch():
    (block,) = python_blocks(DOCS / "how-to" / "slow-samples.md")
    namespace: dict = {}
    exec(compile(block, "slow-samples.md", "exec"), namespace)
    assert namespace["seen"] == sorted(i % 10 for i in range(512))
    assert namespace["train"].ready_first and namespace["train"].stats().ready_first
