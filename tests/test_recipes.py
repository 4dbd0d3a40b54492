"""The recipes of ``docs/architecture.md``, each followed once: a source in its smallest form
(``helpers.MemorySource``), through the cache with nothing more; and the step each recipe asks of every
source, peer loader and what-if knob already in the tree (named where the recipe says), so that the next
one is held to it too."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from helpers import MemorySource

import loader
from loader.errors import BadRecordError
from loader.sources import LAZY, Source
from loader.sources import __all__ as SOURCES_ALL
from stallbench.analysis.knobs import KNOBS
from stallbench.analysis.results import LoaderReport
from stallbench.jobs import others
from stallbench.jobs.kinds import CACHED, KINDS, TORCH
from stallbench.report.table import DRAWN

REPO = Path(__file__).resolve().parents[1]


def test_a_source_written_by_the_recipe_is_cached_by_the_loader_with_nothing_more(tmp_path):
    source = MemorySource(40)  # the recipe in its smallest form: the five members, nothing of the loader's
    cache = dict(cache_bytes=1 << 20, cache_dir=tmp_path)
    dl = loader.DataLoader(loader.SourceDataset(source), batch_size=8, collate_fn=list, **cache)
    epochs = [[sample for batch in dl for sample in batch] for _ in range(2)]
    assert epochs[0] == epochs[1] == [(source.read(i), source.label(i)) for i in range(40)]
    stats = dl.stats()
    assert (stats.misses, stats.hits) == (40, 40)  # every record read once, then served by the cache


def test_a_bad_record_of_a_recipe_source_is_named():
    source = MemorySource(8)
    source.records[5] = None
    dl = loader.DataLoader(loader.SourceDataset(source), batch_size=4, collate_fn=list)
    with pytest.raises(BadRecordError, match=r"memory\[5\]"):
        list(dl)


def _source_classes() -> dict[str, str]:
    """Each public, concrete ``Source`` subclass defined in a module of ``loader/sources/``: its module."""
    found = {}
    for path in sorted((REPO / "loader" / "sources").glob("[!_]*.py")):
        module = importlib.import_module(f"loader.sources.{path.stem}")
        for name, cls in vars(module).items():
            mine = inspect.isclass(cls) and cls.__module__ == module.__name__ and not name.startswith("_")
            if mine and issubclass(cls, Source) and not inspect.isabstract(cls):
                found[name] = module.__name__
    return found


def test_every_source_is_named_where_the_recipe_says():
    classes = _source_classes()
    assert {"ImageFolderSource", "TarShardsSource", "LMDBSource", "ArrowSource"} <= set(classes)
    for name, module in classes.items():
        assert LAZY.get(name) == module and name in SOURCES_ALL, f"{name} is not named in loader.sources"


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in (TORCH, CACHED)])
def test_every_peer_loader_is_built_and_converted_where_the_recipe_says(kind):
    build = getattr(others, f"build_{kind}", None)
    assert callable(build), f"stallbench/jobs/others.py has no build_{kind}"
    assert list(inspect.signature(build).parameters)[:3] == ["dataset", "collate", "job"]
    if KINDS[kind].converts:
        assert kind in others.WRITERS, f"others.convert has no writer for {kind}"


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_every_knob_is_a_report_field_and_drawn_where_the_recipe_says(knob):
    assert knob.name in LoaderReport.__dataclass_fields__ and knob.name in DRAWN
