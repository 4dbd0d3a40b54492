"""``stallbench._jobs``: a job runs with its own TMPDIR, removed whatever the job leaves in it."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from stallbench._jobs import OVERHEAD_MARGIN, memory_limit, run_job

# A DataLoader worker shares a tensor through a listener socket in multiprocessing's temp dir
# (pymp-*/listener-*), which it removes only when it exits normally: this job makes one and dies as a
# killed worker does.
_LEAVES_PYMP = """
import json, multiprocessing.connection, os, sys
listener = multiprocessing.connection.Listener()
print(json.dumps({"tmpdir": os.environ["TMPDIR"], "socket": listener.address}), flush=True)
os._exit(int(sys.argv[1]))
"""


@pytest.fixture(params=["short", "long"])
def scratch(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temporary folder for the test (short, or one too deep for a socket below it)."""
    folder = tmp_path / ("t" if request.param == "short" else "t" * 80)
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    return folder


def test_a_job_gets_a_private_tmpdir_that_is_removed(scratch: Path) -> None:
    (record,) = run_job([sys.executable, "-c", _LEAVES_PYMP, "0"])
    tmpdir = Path(record["tmpdir"])
    assert Path(record["socket"]).parent.parent == tmpdir and not tmpdir.exists()
    socket_fits = len(f"{scratch}/sb-12345678/pymp-12345678/listener-12345678") <= 107  # sun_path's limit
    assert tmpdir.parent == (scratch if socket_fits else Path("/tmp"))
    assert not list(scratch.iterdir())


def test_a_failed_job_leaves_no_tmpdir_either(scratch: Path) -> None:
    with pytest.raises(RuntimeError, match="exited 3"):
        run_job([sys.executable, "-c", _LEAVES_PYMP, "3"])
    assert not list(scratch.iterdir())


@pytest.mark.parametrize("cache", [0, 100 << 20, 4 << 30, 40 << 30])
def test_the_memory_limit_leaves_the_cache_its_budget_beside_the_reserve_it_keeps(cache):
    from loader._memory import reserve_for_limit

    overheads = {"torch": 300 << 20, "cached": 250 << 20}
    base = cache + (300 << 20) + OVERHEAD_MARGIN
    limit = memory_limit(cache, overheads, workers=1)
    assert limit - reserve_for_limit(limit) >= base  # the cache can fill to its budget before it pauses
    assert limit - reserve_for_limit(limit) < base + (2 << 20)  # and the page cache gets no more than that
