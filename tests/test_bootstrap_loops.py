"""The loops frameworks write, measured as they run: an epoch that ends at ``len()`` (Lightning), one
iterator kept across epochs (timm), a user's subclass, a loader rebuilt every evaluation (Hugging Face
Trainer), a batch sampler (accelerate), an iterable Dataset replayed in ingestion, text-mode reads."""

from __future__ import annotations

import pytest

from stallbench.analysis.user_analysis import replay_lengths
from tests.test_bootstrap import OUR_CLASS, TORCH_CLASS, _ok, _run


def _complete(run, loader: str) -> list[tuple[int, int, bool]]:
    return [(r.epoch, r.batches, r.complete) for r in run.of(loader)]


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.multiproc)])
def test_an_epoch_that_stops_at_len_is_complete_and_its_last_step_counts(tmp_path, workers):
    run = _ok(_run(tmp_path, "--to-len", "--eval", "--sleep", "0.02", "--workers", str(workers)))
    assert [(e["train"], e["eval"]) for e in run.epochs] == [(5, 3)] * 3
    assert _complete(run, "0:RandomData") == [(1, 5, True), (2, 5, True), (3, 5, True)]
    assert _complete(run, "1:RandomData") == [(1, 3, True), (2, 3, True), (3, 3, True)]
    for r in run.records:  # the step after the last batch is in the epoch: 5 (or 3) sleeps of 20 ms
        assert r.step_seconds >= r.batches * 0.02 * 0.95
        assert r.wait_seconds + r.step_seconds == pytest.approx(r.seconds, rel=0.02)


def test_epochs_that_stop_at_len_end_the_process_after_the_asked_epochs(tmp_path):
    run = _ok(_run(tmp_path, "--to-len", "--epochs", "5", epochs=2))
    assert [e["epoch"] for e in run.epochs] == [1, 2]
    assert _complete(run, "0:RandomData") == [(1, 5, True), (2, 5, True)]


def test_steps_shorten_len_so_a_loop_to_len_ends_its_epoch_there(tmp_path):
    run = _ok(_run(tmp_path, "--to-len", "--eval", steps=2))
    assert [(e["train"], e["eval"]) for e in run.epochs] == [(2, 2)] * 3  # the eval loop ran every epoch
    assert {(r.batches, r.complete) for r in run.records} == {(2, True)} and len(run.records) == 6


@pytest.mark.parametrize("mode", ["pipeline", "ingestion"])
def test_one_iterator_kept_across_epochs_is_timed_per_epoch_and_never_breaks_the_script(tmp_path, mode):
    run = _ok(_run(tmp_path, "--loader-class", "multi-epochs", "--workers", "2", mode=mode, replay_batches=2))
    assert [e["train"] for e in run.epochs] == [5, 5, 5]
    assert _complete(run, "0:RandomData") == [(1, 5, True), (2, 5, True), (3, 5, True)]
    assert {r.mode for r in run.records} == {mode}


@pytest.mark.parametrize("mode", ["pipeline", "ingestion"])
def test_a_subclass_with_its_own_iter_is_timed_at_it(tmp_path, mode):
    run = _ok(_run(tmp_path, "--loader-class", "subclass", "--sleep", "0.01", mode=mode, replay_batches=1))
    assert [e["train"] for e in run.epochs] == [5, 5, 5]
    assert _complete(run, "0:RandomData") == [(1, 5, True), (2, 5, True), (3, 5, True)]
    assert all(r.step_seconds >= 5 * 0.01 * 0.95 for r in run.records)


def test_a_subclass_is_built_on_our_loader_when_ours_is_asked_for(tmp_path):
    run = _ok(_run(tmp_path, "--loader-class", "subclass", loader="cached", cache_dir=str(tmp_path)))
    assert {r.loader_class for r in run.records} == {OUR_CLASS} and len(run.records) == 3
    assert "MyLoader derives from torch.utils.data.dataloader.DataLoader" in run.stderr
    assert "built on loader.dataloader.DataLoader" in run.stderr


def test_a_subclass_of_ours_is_built_on_torchs_when_torchs_is_asked_for(tmp_path):
    script = tmp_path / "sub_of_ours.py"
    script.write_text(
        "import json, torch, loader\n"
        "class Mine(loader.DataLoader):\n"
        "    pass\n"
        "dl = Mine(torch.utils.data.TensorDataset(torch.arange(10.0)), batch_size=5, cache_bytes=1 << 20)\n"
        "print(json.dumps({'pid': 0}))\n"
        "for epoch in range(2):\n"
        "    print(json.dumps({'epoch': epoch, 'train': sum(1 for _ in dl)}))\n"
    )
    run = _ok(_run(tmp_path, script=script, loader="torch"))
    assert [e["train"] for e in run.epochs] == [2, 2]
    assert {r.loader_class for r in run.records} == {TORCH_CLASS}
    assert "Mine derives from loader.dataloader.DataLoader" in run.stderr


def test_only_a_subclass_the_script_builds_is_named(tmp_path):
    """A framework defines subclasses on import that a script may never build (issue 48): the line comes
    when one is built, for it and the subclass it derives from, and never for one only defined."""
    script = tmp_path / "two_subclasses.py"
    script.write_text(
        "import json, torch\n"
        "class NeverBuilt(torch.utils.data.DataLoader):\n"
        "    pass\n"
        "class Built(torch.utils.data.DataLoader):\n"
        "    pass\n"
        "class BuiltBelow(Built):\n"
        "    pass\n"
        "dl = BuiltBelow(torch.utils.data.TensorDataset(torch.arange(10.0)), batch_size=5)\n"
        "print(json.dumps({'pid': 0}))\n"
        "for epoch in range(2):\n"
        "    print(json.dumps({'epoch': epoch, 'train': sum(1 for _ in dl)}))\n"
    )
    run = _ok(_run(tmp_path, script=script, loader="cached", cache_dir=str(tmp_path)))
    assert [e["train"] for e in run.epochs] == [2, 2]
    assert {r.loader_class for r in run.records} == {OUR_CLASS}
    assert "stallbench: Built derives from torch.utils.data.dataloader.DataLoader" in run.stderr
    assert "NeverBuilt" not in run.stderr


def test_an_eval_loader_rebuilt_every_epoch_is_one_loader(tmp_path):
    run = _ok(_run(tmp_path, "--eval", "--rebuild-eval"))
    assert sorted({r.loader for r in run.records}) == ["0:RandomData", "1:RandomData"]
    assert [r.epoch for r in run.of("1:RandomData")] == [1, 2, 3]


def test_train_and_eval_loaders_of_one_shape_stay_two_loaders(tmp_path):
    """One class, one batch size, no length: the eval loader is another loader, not the train loader
    rebuilt, so the script runs its 3 training epochs and each loader's epochs are its own (issue 48)."""
    run = _ok(_run(tmp_path, "--iterable", "--eval", "--eval-iterable"))
    assert [(e["train"], e["eval"]) for e in run.epochs] == [(5, 3)] * 3
    assert _complete(run, "0:StreamData") == [(1, 5, True), (2, 5, True), (3, 5, True)]
    assert _complete(run, "1:StreamData") == [(1, 3, True), (2, 3, True), (3, 3, True)]


def test_optimizer_updates_are_the_steps_made_not_the_batches(tmp_path):
    """Gradient accumulation over 4 batches: 10 batches an epoch make 2 updates (issue 48); the evaluation
    loader's epochs make none."""
    run = _ok(_run(tmp_path, "--accumulate", "4", "--batch-size", "4", "--eval"))
    assert [(r.batches, r.optimizer_steps) for r in run.of("0:RandomData")] == [(10, 2)] * 3
    assert {r.optimizer_steps for r in run.of("1:RandomData")} == {0}


def test_a_step_amp_s_scaler_skips_is_no_update(tmp_path):
    """AMP's GradScaler skips the ``optimizer.step()`` of a batch whose gradients overflowed (issue 48):
    10 steps an epoch, every 5th overflowing, make 8 updates."""
    run = _ok(_run(tmp_path, "--accumulate", "1", "--overflow-every", "5", "--batch-size", "4"))
    assert [(r.batches, r.optimizer_steps) for r in run.of("0:RandomData")] == [(10, 8)] * 3


def test_the_batch_size_of_a_batch_sampler_is_recorded(tmp_path):
    run = _ok(_run(tmp_path, "--batch-sampler"))
    assert {(r.batch_size, r.batches, r.samples) for r in run.records} == {(8, 5, 40)}
    assert {r.optimizer_steps for r in run.records} == {None}  # no optimizer: updates counted by batches


def test_ingestion_of_an_iterable_dataset_replays_as_many_batches_as_the_pipeline_made(tmp_path):
    pipeline = _ok(_run(tmp_path / "prep", "--iterable", "--n", "100", "--workers", "2"))
    lengths = replay_lengths(pipeline.records)
    assert lengths == {"0:StreamData": (14, 14, 14)}  # 2 workers of 50 samples: 7 batches each
    run = _ok(
        _run(tmp_path / "ingestion", "--iterable", "--n", "100", mode="ingestion", replay_lengths=lengths)
    )
    assert [e["train"] for e in run.epochs] == [14, 14, 14] and "no length" not in run.stderr


def test_reads_in_text_mode_are_served_through_the_cache(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    for i in range(10):
        (files / f"{i:02d}.txt").write_bytes(bytes(range(i + 40, i + 104)))
    spec = {"loader": "cached", "data": (str(files),), "cache_bytes": 1 << 20, "cache_dir": str(tmp_path)}
    run = _ok(_run(tmp_path, "--files", str(files), "--text", "--epochs", "2", "--batch-size", "5", **spec))
    first, second = run.of("0:FileData")
    assert (first.hits + first.misses, second.hits, second.misses) == (10, 10, 0)
