"""``stallbench demo`` end to end in a subprocess, on a tiny image set; the CLI's usage errors."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallbench import demo
from stallbench.cli import main
from stallbench.demo import format_table

REPO = Path(__file__).resolve().parents[1]
SHM = Path("/dev/shm")
TINY = ["--num-images", "48", "--epochs", "2", "--batch-size", "16"]


def _stallbench(*args: str, **popen: object) -> subprocess.Popen:
    paths = [str(REPO), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    cmd = [sys.executable, "-m", "stallbench", *args]
    return subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


@pytest.mark.slow
@pytest.mark.multiproc
def test_demo_prints_both_loaders_side_by_side(tmp_path: Path) -> None:
    report = tmp_path / "demo.json"
    with _stallbench("demo", "--data-dir", str(tmp_path), *TINY, "--json", str(report)) as proc:
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    for text in ("PIL build:", "torch.utils.data.DataLoader", "loader.DataLoader", "torch storage MB"):
        assert text in out
    assert "ours storage MB" in out and "ours hit rate" in out
    assert "throttled" in out  # either "throttled to 200 MB/s" or "NOT throttled (why)"
    data = json.loads(report.read_text())
    torch_epochs, ours_epochs = data["loaders"]["torch"], data["loaders"]["cached"]
    assert [e["epoch"] for e in torch_epochs] == [e["epoch"] for e in ours_epochs] == [1, 2]
    assert ours_epochs[0]["storage_bytes"] > 0 and ours_epochs[1]["hit_rate"] > 0


@pytest.mark.slow
@pytest.mark.multiproc
def test_demo_interrupted_cleans_up(tmp_path: Path) -> None:
    before = set(SHM.glob("stallbench-run-*"))
    with _stallbench("demo", "--data-dir", str(tmp_path), *TINY, "--epochs", "50") as proc:
        for line in proc.stdout:
            if line.startswith("running loader.DataLoader"):
                break
        deadline = time.monotonic() + 30
        while not set(SHM.glob("stallbench-run-*")) - before and time.monotonic() < deadline:
            time.sleep(0.05)  # until our loader's cache folder exists
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not set(SHM.glob("stallbench-run-*")) - before  # the cache folder is gone


def test_help_works(capsys: pytest.CaptureFixture[str]) -> None:
    with _stallbench("--help") as proc:
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "demo" in out
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "--cache-fraction" in out and "--num-images" not in out


@pytest.mark.parametrize(
    "argv", [[], ["demo", "--bogus"], ["demo", "--epochs", "0"], ["demo", "--cache-fraction", "1.5"]]
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_format_table_aligns_columns() -> None:
    text = format_table(["a", "bb"], [[1, 2.5], [100, 0.125]])
    assert text.splitlines() == ["  a    bb", "---  ----", "  1  2.50", "100  0.12"]


@pytest.mark.slow
@pytest.mark.multiproc
def test_demo_says_when_storage_is_not_throttled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = "cannot create cgroup: needs root"
    unavailable = dict.fromkeys(("page_cache_eviction", "memory_limit", "read_throttle"), reason)
    monkeypatch.setattr(demo, "probe_storage_conditions", lambda path: unavailable)
    out = io.StringIO()
    report = demo.run_demo(demo.DemoOptions(tmp_path, epochs=1, batch_size=16, num_images=32), out)
    assert f"storage is NOT throttled and memory is NOT limited (memory limit: {reason}" in out.getvalue()
    assert report["memory_limit"] is None and report["read_bps"] is None
    assert len(report["loaders"]["torch"]) == len(report["loaders"]["cached"]) == 1
