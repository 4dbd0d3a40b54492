"""One handler for analyze and compare, whatever the target (``stallbench.cli.targets.run_target``): each
exit code of its ladder, with what was done before a failure printed and written."""

from __future__ import annotations

import argparse
import json
import signal

import pytest
from test_report import make_report

from stallbench.cli.commands import report_outputs
from stallbench.cli.stops import Stopped
from stallbench.cli.targets import run_target
from stallbench.conditions.cgroup import StorageConditionUnavailable
from stallbench.jobs.command import CommandFailed

GB = 10**9


class Fake:
    """A target that prepares, runs and finishes as told: ``fail_prepare`` raised by ``prepare``, the reports
    yielded, then ``fail_runs`` raised."""

    progress = ("runs", "run")

    def __init__(self, fail_prepare=None, reports=(), fail_runs=None) -> None:
        self.fail_prepare, self.done, self.fail_runs = fail_prepare, reports, fail_runs
        self.finished = False

    def prepare(self, args):
        if self.fail_prepare is not None:
            raise self.fail_prepare

    def steps(self) -> int:
        return 3

    def results(self, on_step):
        yield from self.done
        if self.fail_runs is not None:
            raise self.fail_runs

    def write(self, args, done):
        report_outputs(args, done)

    def finish(self, done):
        self.finished = True


def args(tmp_path) -> argparse.Namespace:
    return argparse.Namespace(command="analyze", json=tmp_path / "r.json", plot=None, no_progress=True)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ValueError("--data x holds no file"), 2),
        (StorageConditionUnavailable("the cgroup v1 'blkio' controller is not mounted"), 2),
        (CommandFailed(["python", "train.py"], 3, ["ValueError: x"]), 1),
    ],
)
def test_a_target_that_cannot_be_prepared_exits_with_its_code_and_names_why(tmp_path, capsys, error, code):
    assert run_target(args(tmp_path), Fake(fail_prepare=error)) == code
    err = capsys.readouterr().err
    assert f"stallbench analyze: error: {error}" in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (StorageConditionUnavailable("--memory-limit 1.05 MB is too small"), 2),
        (CommandFailed(["python", "train.py"], 1, []), 1),
        (OSError("cannot read a file"), 1),
    ],
)
def test_a_run_that_fails_keeps_the_loaders_done(tmp_path, capsys, error, code):
    done = make_report("torch", 15.25, 8.0, GB)
    target = Fake(reports=[done], fail_runs=error)
    assert run_target(args(tmp_path), target) == code
    out, err = capsys.readouterr()
    assert str(error) in err and "15.25 s" in out  # the loader done, printed
    assert [r["loader"] for r in json.loads((tmp_path / "r.json").read_text())["loaders"]] == ["torch"]
    assert not target.finished  # no --apply after a failure


def test_a_stop_during_the_runs_writes_what_was_done_and_exits_128_plus_its_number(tmp_path, capsys):
    target = Fake(reports=[make_report("torch", 15.25, 8.0, GB)], fail_runs=Stopped(signal.SIGTERM))
    assert run_target(args(tmp_path), target) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in capsys.readouterr().err and (tmp_path / "r.json").exists()


def test_a_target_that_runs_through_is_printed_written_and_finished(tmp_path, capsys):
    target = Fake(reports=[make_report("torch", 15.25, 8.0, GB)])
    assert run_target(args(tmp_path), target) == 0
    assert "15.25 s" in capsys.readouterr().out and target.finished
