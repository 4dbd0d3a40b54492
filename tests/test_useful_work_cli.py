"""``stallbench compare --packing``: the reference's command on tiny token data, padded beside packed."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stallbench.report import validate_report_json
from tests.helpers import make_jpeg_folder

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "stallbench.md"


def stallbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "stallbench", *args]
    return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=300, cwd=cwd)


def documented_packing_command() -> list[str]:
    """The reference's ``stallbench compare ... --packing`` line, as arguments after ``stallbench``."""
    (line,) = [
        line for line in re.findall(r"^stallbench .*$", REFERENCE.read_text(), re.M) if "--packing" in line
    ]
    return shlex.split(line)[1:]


@pytest.mark.slow
@pytest.mark.multiproc
def test_the_documented_command_puts_padded_and_packed_side_by_side(tmp_path):
    args = [a.replace("tokens:2000", "tokens:300") for a in documented_packing_command()]
    assert "tokens:300" in args
    done = stallbench(
        *args, "--data-dir", str(tmp_path / "data"), "--json", "r.json", "--no-progress", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for row in ("valid tokens/s", "padded tokens/s", "padding", "optimizer updates", "J per 1k valid tokens"):
        assert f"  {row}  " in done.stdout, row
    report = json.loads((tmp_path / "r.json").read_text())
    validate_report_json(report)
    padded, packed = report["loaders"]
    assert (padded["loader"], packed["loader"]) == ("torch", "torch+ffd")
    assert packed["useful"]["packing"] == "ffd" and padded["useful"]["packing"] is None
    assert padded["useful"]["valid_tokens"] == packed["useful"]["valid_tokens"]  # the same examples
    assert padded["useful"]["padding_fraction"] > 0.3
    assert 0 < packed["useful"]["padding_fraction"] < padded["useful"]["padding_fraction"]  # the room left
    assert padded["useful"]["unique_samples"] == packed["useful"]["unique_samples"] == 300
    per_step = {r["loader"]: r["useful"]["token_slots"] / r["useful"]["updates"] for r in (padded, packed)}
    assert per_step["torch+ffd"] == pytest.approx(per_step["torch"], rel=0.25), per_step  # one budget a step
    assert packed["useful"]["updates"] < padded["useful"]["updates"]  # the same tokens in fuller steps
    assert padded["useful"]["energy_source"] in ("estimate", "rapl", "nvml", "rapl+nvml")
    cold = padded["runs"][2]["epochs"]
    assert all(e["token_slots"] > e["valid_tokens"] > 0 for e in cold)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compare", "--data", "tokens:8", "--max-len", "64"], "--max-len is the pack length of --packing"),
        (["compare", "--data", "tokens:8", "--packing", "best"], "invalid choice: 'best'"),
        (
            ["compare", "--data", "tokens:8", "--packing", "ffd", "--jobs", "2"],
            "--packing does not act on compare --jobs",
        ),
        (["analyze", "--data", "tokens:8", "--packing", "ffd", "--", "python", "x.py"], "takes no command"),
    ],
)
def test_usage_errors_exit_2(args, message, tmp_path):
    done = stallbench(*args, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_packing_images_is_a_usage_error(tmp_path):
    make_jpeg_folder(tmp_path / "imgs")
    done = stallbench("analyze", "--data", "imgs", "--packing", "ffd", "--no-progress", cwd=tmp_path)
    assert done.returncode == 2 and "--packing needs token sequences" in done.stderr, done.stderr
