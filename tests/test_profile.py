"""stallbench.profile: waits and steps of a user's loop, transitions apart, JSON, timeline and errors."""

from __future__ import annotations

import dataclasses
import importlib
import json
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import loader
from stallbench.profile import PROFILE_SCHEMA_VERSION, profile

profile_module = importlib.import_module("stallbench.profile")  # the package exports the function


class SleepyLoader:
    """Yields ``n`` batches, sleeping ``wait`` in each __next__ (``first`` in the first one)."""

    def __init__(self, n: int, wait: float, first: float | None = None) -> None:
        self.n, self.wait, self.first = n, wait, first

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.first if i == 0 and self.first is not None else self.wait)
            yield i


class SlowStartLoader(list):
    """Sleeps in ``iter()`` itself, as a torch DataLoader does while it starts its workers."""

    def __iter__(self):
        time.sleep(0.100)
        return super().__iter__()


@dataclasses.dataclass
class FakeStats:
    hits: int = 3
    fetch_seconds: float = 0.5


class LoaderWithStats(list):
    def stats(self) -> FakeStats:
        return FakeStats()


def _run(prof, epochs: int = 1, step: float = 0.0) -> None:
    for _ in range(epochs):
        for _batch in prof:
            time.sleep(step)


def test_waiting_loader_shows_a_large_wait_share() -> None:
    prof = profile(SleepyLoader(8, wait=0.020))
    _run(prof, step=0.005)
    steady = prof.to_dict()["steady"]
    assert steady["iterations"] == 7
    assert steady["wait_fraction"] > 0.6
    assert steady["wait_p50_s"] > 2 * steady["step_p50_s"]


def test_slow_step_shows_a_small_wait_share() -> None:
    prof = profile(SleepyLoader(8, wait=0.005))
    _run(prof, step=0.020)
    steady = prof.to_dict()["steady"]
    assert steady["wait_fraction"] < 0.4
    assert steady["step_mean_s"] > 2 * steady["wait_mean_s"]
    assert steady["iterations_per_s"] < 1 / 0.020


def test_slow_first_batch_is_a_transition_not_steady_state() -> None:
    prof = profile(SleepyLoader(5, wait=0.002, first=0.200))
    _run(prof, epochs=2)
    data = prof.to_dict()
    firsts = data["transitions"]["first_batch_s"]
    assert len(firsts) == 2 and min(firsts) >= 0.2
    assert [e["first_batch_s"] for e in data["epochs"]] == firsts
    assert data["steady"]["iterations"] == 8
    assert data["steady"]["wait_s"] < 0.1
    assert len(data["transitions"]["epoch_end_wait_s"]) == 2
    assert len(data["transitions"]["epoch_gap_s"]) == 1


def test_iter_start_up_counts_in_the_first_batch() -> None:
    prof = profile(SlowStartLoader(range(3)))
    _run(prof)
    assert prof.to_dict()["transitions"]["first_batch_s"][0] >= 0.100
    assert prof.to_dict()["steady"]["wait_s"] < 0.050


def test_phases_are_timed_and_kept_out_of_steps_and_gaps() -> None:
    prof = profile(list(range(4)))
    for _ in range(2):
        for batch in prof:
            if batch == 1:
                with prof.phase("checkpoint"):
                    time.sleep(0.050)
        with prof.phase("eval"):
            time.sleep(0.030)
    data = prof.to_dict()
    phases = data["transitions"]["phases"]
    assert sorted(phases) == ["checkpoint", "eval"]
    assert len(phases["eval"]) == 2 and min(phases["eval"]) >= 0.030
    assert len(phases["checkpoint"]) == 2 and min(phases["checkpoint"]) >= 0.050
    assert data["transitions"]["epoch_gap_s"][0] < 0.020
    assert data["steady"]["step_p95_s"] < 0.030
    assert all(e["step_s"] < 0.040 for e in data["epochs"])


def test_break_keeps_the_partial_epoch() -> None:
    prof = profile(list(range(10)))
    _run(prof)
    for batch in prof:
        time.sleep(0.010)
        if batch == 3:
            break
    epochs = prof.to_dict()["epochs"]
    assert [(e["iterations"], e["complete"]) for e in epochs] == [(10, True), (4, False)]
    assert epochs[1]["end_wait_s"] is None
    step = prof.timeline().step_s
    assert np.all(np.isfinite(step)) and step[-1] >= 0.010


def test_interrupted_loop_still_has_a_summary() -> None:
    prof = profile(SleepyLoader(10, wait=0.001))
    with pytest.raises(KeyboardInterrupt):
        for batch in prof:
            if batch == 5:
                raise KeyboardInterrupt
    assert prof.to_dict()["epochs"][0]["iterations"] == 6
    assert "steady state: 5 batches" in prof.summary()


def test_open_epoch_is_readable_mid_loop() -> None:
    prof = profile(list(range(5)))
    it = iter(prof)
    next(it), next(it)
    tl = prof.timeline()
    assert tl.wait_s.shape == (2,) and np.isnan(tl.step_s[-1]) and np.isfinite(tl.step_s[0])
    assert prof.to_dict()["steady"]["iterations"] == 0
    assert list(it) == [2, 3, 4]
    assert prof.to_dict()["epochs"][0]["complete"]


def test_timeline_shape_and_order() -> None:
    prof = profile(list(range(3)))
    _run(prof, epochs=2)
    _run(profile([]))
    tl = prof.timeline()
    assert [a.shape for a in tl] == [(6,)] * 4
    assert tl.epoch.tolist() == [0, 0, 0, 1, 1, 1] and tl.index.tolist() == [0, 1, 2] * 2
    assert np.all(tl.wait_s >= 0) and np.all(tl.step_s >= 0)


def test_torch_dataloader_and_summary_table() -> None:
    dl = DataLoader(TensorDataset(torch.arange(40.0)), batch_size=8)
    prof = profile(dl, name="tensors")
    seen = [len(b[0]) for b in prof]
    assert seen == [8] * 5
    text = prof.summary()
    assert "profile 'tensors': 1 epoch, 5 batches" in text
    assert "first batch" in text and "epoch end wait" in text


def test_json_round_trip_and_schema(tmp_path: Path) -> None:
    prof = profile(LoaderWithStats(range(6)), name="fake")
    _run(prof, epochs=2)
    with prof.phase("eval"):
        pass
    path = prof.save(tmp_path / "profile.json")
    data = json.loads(path.read_text())
    assert data == json.loads(json.dumps(prof.to_dict()))
    assert data["schema"] == f"stallbench.profile/{PROFILE_SCHEMA_VERSION}" == "stallbench.profile/1"
    assert set(data) == {"schema", "name", "epochs", "steady", "transitions", "loader_stats"}
    assert set(data["transitions"]) == {"first_batch_s", "epoch_gap_s", "epoch_end_wait_s", "phases"}
    assert data["loader_stats"] == {"hits": 3, "fetch_seconds": 0.5}
    assert data["steady"]["iterations"] == 10
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]
    schema = json.loads(
        (Path(__file__).resolve().parents[1] / "docs" / "stallbench-profile.schema.json").read_text()
    )
    jsonschema.validate(data, schema)  # the published schema, with jsonschema itself
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**data, "epochs": [{"index": 0}]}, schema)


def test_our_dataloader_stats_are_included() -> None:
    dl = loader.DataLoader(TensorDataset(torch.arange(32.0)), batch_size=8)
    prof = profile(dl)
    _run(prof)
    stats = prof.to_dict()["loader_stats"]
    assert stats is not None and set(stats) >= {"hits", "misses", "fetch_seconds", "samples"}


def test_loader_without_stats_saves_null(tmp_path: Path) -> None:
    prof = profile(range(3))
    _run(prof)
    assert json.loads(prof.save(tmp_path / "p.json").read_text())["loader_stats"] is None


def test_stats_of_another_kind_warn_and_save_null() -> None:
    class OddStats(list):
        def stats(self) -> int:
            return 7

    prof = profile(OddStats([1]))
    with pytest.warns(UserWarning, match="OddStats.stats\\(\\) returned int"):
        assert prof.to_dict()["loader_stats"] is None


def test_failed_save_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(profile_module.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        profile([1]).save(tmp_path / "p.json")
    assert list(tmp_path.iterdir()) == []


def test_errors() -> None:
    with pytest.raises(TypeError, match="int"):
        profile(3)
    with pytest.raises(TypeError, match="name must be a string"):
        profile([], name=1)
    prof = profile([1, 2])
    with pytest.raises(ValueError, match="non-empty"), prof.phase(""):
        pass
    with prof.phase("eval"):
        with pytest.raises(ValueError, match=r"'ckpt'.*'eval'"), prof.phase("ckpt"):
            pass
        with pytest.raises(ValueError, match="'eval'"):
            list(prof)
    assert list(prof) == [1, 2]
    assert list(prof.to_dict()["transitions"]["phases"]) == ["eval"]


def test_profile_times_with_the_bootstraps_layer_and_its_phases_are_its_transitions() -> None:
    from stallbench.jobs import _transitions
    from stallbench.jobs._timed import EpochMeter

    prof = profile(list(range(3)))
    before = _transitions.reading()
    for batch in prof:
        if batch == 0:
            with prof.phase("eval"):
                time.sleep(0.020)
    (epoch,) = prof._epochs
    assert isinstance(epoch.meter, EpochMeter)  # the meter `stallbench analyze` writes LoaderEpoch lines from
    assert _transitions.since(before)["phase"][1] == 1
    assert epoch.meter.transitions["phase"][0] >= 0.020  # taken out of the first step
    assert epoch.meter.batches == 3 and prof.to_dict()["epochs"][0]["step_s"] < 0.020


def test_another_profiles_phase_is_left_in_this_ones_step_and_a_nested_event_is_counted_once() -> None:
    from stallbench.jobs import _transitions

    outer, other = profile(list(range(2))), profile([])
    for batch in outer:
        if batch == 0:
            with other.phase("x"):  # another profile's: still this loop's step
                time.sleep(0.030)
            with outer.phase("eval"):  # an evaluation inside it: one transition each moment
                began = time.perf_counter()
                time.sleep(0.030)
                _transitions.end_epoch("1:EvalSet", began, time.perf_counter(), {})
    meter = outer._epochs[0].meter
    assert 0.030 <= meter.step < 0.045
    assert meter.transitions["evaluation"][0] >= 0.030 and meter.transitions["phase"][0] < 0.010


def test_a_loader_iterated_inside_a_profiled_next_is_not_taken_for_the_bootstraps() -> None:
    from stallbench.jobs._timed import handing_out

    seen = []

    class Wrapper:  # iterates its loader lazily, inside the profile's __next__
        def __iter__(self):
            seen.append(handing_out())
            yield from range(3)

    _run(profile(Wrapper()))
    assert seen == [False]


def test_every_batch_of_a_long_epoch_is_kept() -> None:
    prof = profile(range(100_005))  # past the bootstrap's 100,000 kept per epoch
    _run(prof)
    assert prof.to_dict()["steady"]["iterations"] == 100_004 and len(prof.timeline().wait_s) == 100_005


def test_a_loader_that_fails_to_start_ends_its_epoch_there() -> None:
    class Broken:
        def __iter__(self):
            raise RuntimeError("no workers")

    prof = profile(Broken())
    with pytest.raises(RuntimeError, match="no workers"):
        _run(prof)
    (row,) = prof.to_dict()["epochs"]
    assert (row["iterations"], row["complete"]) == (0, False) and prof._epochs[0].end is not None
