"""``stallbench demo`` end to end in a subprocess, on a tiny image set (the run of the README's command that
``test_readme`` makes too), and its fallbacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallbench import demo
from stallbench._grid import plain_table
from stallbench.analysis.request import NamedWorkload
from stallbench.cli import DEMO_LIMITS, make_parser
from stallbench.conditions import limits
from stallbench.report import validate_report_json


@pytest.mark.slow
@pytest.mark.multiproc
def test_demo_compares_both_loaders_and_writes_a_plot(demo_run) -> None:
    folder, done = demo_run("--no-progress")  # the README's `stallbench demo`: test_readme's run too
    assert done.returncode == 0, done.stderr
    for text in ("PIL build:", "torch.utils.data.DataLoader", "loader.DataLoader", "cached vs torch"):
        assert text in done.stdout
    assert "torch storage MB" in done.stdout and "cached storage MB" in done.stdout  # epoch by epoch
    assert "throttled" in done.stdout  # "throttled to 75 MB/s", or "NOT throttled (why)"
    report = json.loads((folder / "demo.json").read_text())
    validate_report_json(report)
    assert [entry["loader"] for entry in report["loaders"]] == ["torch", "cached"]
    assert (folder / "stallbench-demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_says_when_storage_cannot_be_throttled(tmp_path: Path, monkeypatch, capsys) -> None:
    reason = "cannot create cgroup: needs root"
    probe = {"page_cache_eviction": None, "memory_limit": reason, "storage_bandwidth": reason}
    monkeypatch.setattr(limits, "probe_storage_conditions", lambda path: probe)
    args = make_parser().parse_args(["demo", "--data-dir", str(tmp_path), "--epochs", "1"])
    req, kinds = demo.demo_request(args)
    assert (
        f"storage is NOT throttled and memory is NOT limited (--storage-bandwidth cannot be enforced here: "
        f"{reason})" in capsys.readouterr().out
    )
    assert req.limits == limits.NONE and kinds == ("torch", "cached")


def test_demo_throttles_where_it_can(tmp_path: Path, monkeypatch) -> None:
    conditions = ("page_cache_eviction", "memory_limit", "storage_bandwidth")
    monkeypatch.setattr(limits, "probe_storage_conditions", lambda path: dict.fromkeys(conditions))
    argv = ["demo", "--data-dir", str(tmp_path), "--epochs", "1", "--num-images", "32"]
    req, _ = demo.demo_request(make_parser().parse_args(argv))
    assert (req.limits, req.data) == (DEMO_LIMITS, NamedWorkload("images", 32))
    assert req.limits == limits.Limits(storage_bandwidth=75_000_000, memory_limit="auto")


def test_demo_takes_the_limits_a_user_gives(tmp_path: Path, monkeypatch) -> None:
    conditions = ("page_cache_eviction", "memory_limit", "storage_bandwidth")
    monkeypatch.setattr(limits, "probe_storage_conditions", lambda path: dict.fromkeys(conditions))
    argv = ["demo", "--data-dir", str(tmp_path), "--storage-bandwidth", "200MB/s", "--memory-limit", "3G"]
    req, _ = demo.demo_request(make_parser().parse_args(argv))
    assert req.limits == limits.Limits(storage_bandwidth=200_000_000, memory_limit=3 << 30)


def test_plain_table_aligns_labels_left_and_values_right() -> None:
    text = plain_table(["a", "bb"], [[1, 2.5], [100, 0.125]])
    assert text.splitlines() == ["a      bb", "1    2.50", "100  0.12"]
