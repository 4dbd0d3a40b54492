"""``--apply``'s overrides: every DataLoader built gets the advised workers, whatever the script wrote."""

from __future__ import annotations

import pytest
import torch
from helpers import MemorySource

import loader
from stallbench.jobs._overrides import override_arguments
from stallbench.jobs.spec import JobSpec


@pytest.fixture
def classes(monkeypatch):
    """Fresh subclasses, so the wrapping does not outlive the test."""
    torch_class = type(
        "TorchLoader", (torch.utils.data.DataLoader,), {"__init__": torch.utils.data.DataLoader.__init__}
    )
    ours = type("OurLoader", (loader.DataLoader,), {"__init__": loader.DataLoader.__init__})
    return torch_class, ours


@pytest.mark.parametrize("as_keyword", [True, False])
def test_workers_and_prefetch_replace_the_scripts(classes, as_keyword):
    torch_class, _ = classes
    override_arguments(torch_class, JobSpec(out_dir="", workers=2, prefetch_factor=4))
    args, kwargs = (
        (([0] * 8,), {"batch_size": 2, "num_workers": 1})
        if as_keyword
        else (([0] * 8, 2, False, None, None, 0), {})
    )
    dl = torch_class(*args, **kwargs)
    assert (dl.num_workers, dl.prefetch_factor) == (2, 4)


def test_no_workers_drops_what_torch_refuses_without_them(classes):
    torch_class, _ = classes
    override_arguments(torch_class, JobSpec(out_dir="", workers=0))
    dl = torch_class([0] * 8, batch_size=2, num_workers=2, prefetch_factor=3, persistent_workers=True)
    assert (dl.num_workers, dl.prefetch_factor, dl.persistent_workers) == (0, None, False)
    assert [b.tolist() for b in dl] == [[0, 0]] * 4


def test_our_loader_counts_with_the_workers_it_was_given(classes, shm_dir):
    _, ours = classes
    override_arguments(ours, JobSpec(out_dir="", workers=0))
    dl = ours(
        loader.SourceDataset(MemorySource(8)),
        batch_size=4,
        num_workers=2,
        cache_bytes=1 << 20,
        cache_dir=shm_dir,
    )
    assert dl.num_workers == 0 and len(list(dl)) == 2
    assert dl.stats().misses == 8


def test_nothing_is_wrapped_without_an_override(classes):
    torch_class, _ = classes
    before = torch_class.__init__
    override_arguments(torch_class, JobSpec(out_dir=""))
    assert torch_class.__init__ is before


def test_our_loader_holds_the_form_asked_for_and_torchs_is_not_given_one(classes, shm_dir):
    torch_class, ours = classes
    spec = JobSpec(out_dir="", cache_form="prepared")
    override_arguments(torch_class, spec)
    override_arguments(ours, spec)
    assert torch_class([0] * 8, batch_size=2).batch_size == 2  # torch's takes no cache_form: not given one
    staged = loader.Staged(lambda raw: bytes(raw), lambda prepared: len(prepared), identity="length v1")
    dl = ours(
        loader.SourceDataset(MemorySource(8), transform=staged),
        batch_size=4,
        cache_bytes=1 << 20,
        cache_dir=shm_dir,
        cache_form="raw",
    )
    assert dl.stats().cache_form == "prepared"
    lengths = [len(MemorySource(8).read(i)) for i in range(8)]
    assert [x.tolist() for x, _ in dl] == [lengths[:4], lengths[4:]]


def test_a_form_that_is_not_ours_is_refused_in_the_spec():
    with pytest.raises(ValueError, match="cache_form must be 'auto', 'raw' or 'prepared', got 'cooked'"):
        JobSpec(out_dir="", cache_form="cooked")


def test_our_loader_keeps_its_store_in_the_runs_folder_whatever_the_script_names(classes, tmp_path):
    _, ours = classes
    run_folder, users = tmp_path / "run", tmp_path / "users"
    run_folder.mkdir(mode=0o700)
    users.mkdir(mode=0o700)
    override_arguments(ours, JobSpec(out_dir="", cache_dir=str(run_folder)))
    dl = ours(loader.SourceDataset(MemorySource(8)), batch_size=4, cache_bytes=1 << 20, cache_dir=users)
    assert len(list(dl)) == 2 and dl.stats().misses == 8
    assert list(users.iterdir()) == [] and list(run_folder.iterdir())  # the run's folder holds the store
