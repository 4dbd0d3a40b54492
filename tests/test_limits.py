"""``Limits``: the cold run's limits as one value, from the command line to the cgroup and the report."""

from __future__ import annotations

import pytest

from stallbench.cli import make_parser
from stallbench.conditions import limits as limits_module
from stallbench.conditions.cgroup import StorageConditionUnavailable, StorageLimits
from stallbench.conditions.limits import AUTO, NONE, Limits

MB = 1_000_000


def test_the_flags_resolve_into_one_value_under_their_own_names():
    argv = ["analyze", "--data", "images:8", "--storage-bandwidth", "20MB/s", "--memory-limit", "auto"]
    args = make_parser().parse_args(argv)
    assert args.limits == Limits(storage_bandwidth=20 * MB, memory_limit=AUTO)
    assert not hasattr(args, "storage_bandwidth") and not hasattr(args, "memory_limit")
    assert make_parser().parse_args(["analyze", "--data", "images:8"]).limits == NONE


def test_options_name_what_was_asked_as_typed():
    assert Limits(storage_bandwidth=MB).options() == ["--storage-bandwidth"]
    assert Limits(memory_limit=AUTO).options() == ["--memory-limit"]
    assert NONE.options() == []


def test_known_leaves_auto_unsized_and_sized_fills_it():
    asked = Limits(storage_bandwidth=MB, memory_limit=AUTO)
    assert asked.known() == {"storage_bandwidth": MB, "memory_limit": None}
    assert asked.sized(512 * MB).known() == {"storage_bandwidth": MB, "memory_limit": 512 * MB}


def test_said_states_each_limit_and_what_was_not_asked():
    assert NONE.said() == ["storage not throttled", "memory not limited"]
    assert NONE.said(unset=False) == []
    said = Limits(storage_bandwidth=75 * MB, memory_limit=771_150_000).said()
    assert said == ["storage reads throttled to 75.00 MB/s", "memory limited to 771.15 MB"]
    assert "measured memory" in Limits(memory_limit=AUTO).said(unset=False)[0]


def test_the_cgroup_carries_the_limits_or_is_none():
    assert NONE.cgroup(".") is None
    assert Limits(memory_limit=AUTO).cgroup(".") is None  # not sized yet: no limit to enforce
    cgroup = Limits(storage_bandwidth=2 * MB, memory_limit=64 * MB).cgroup("/tmp")
    assert isinstance(cgroup, StorageLimits)
    assert (cgroup.storage_bandwidth, cgroup.memory_limit, str(cgroup.device_path)) == (
        2 * MB,
        64 * MB,
        "/tmp",
    )
    assert cgroup.readable_in(1.5) == 3 * MB and StorageLimits().readable_in(1.5) is None


@pytest.mark.parametrize(
    ("asked", "problem", "said"),
    [
        (
            Limits(storage_bandwidth=MB),
            "storage_bandwidth",
            "--storage-bandwidth cannot be enforced here: no",
        ),
        (Limits(memory_limit=MB), "memory_limit", "--memory-limit cannot be enforced here: no"),
        (NONE, "page_cache_eviction", "the cold run cannot evict the page cache: no"),
    ],
)
def test_check_names_the_option_the_machine_cannot_enforce(monkeypatch, asked, problem, said):
    probe = {"page_cache_eviction": None, "memory_limit": None, "storage_bandwidth": None, problem: "no"}
    monkeypatch.setattr(limits_module, "probe_storage_conditions", lambda path: probe)
    with pytest.raises(StorageConditionUnavailable, match=said):
        asked.check("/data", cold=True)


def test_check_passes_what_is_not_asked(monkeypatch):
    probe = {"page_cache_eviction": "tmpfs", "memory_limit": "no", "storage_bandwidth": "no"}
    monkeypatch.setattr(limits_module, "probe_storage_conditions", lambda path: probe)
    NONE.check("/data", cold=False)  # a warm run asks nothing of the machine
    with pytest.raises(StorageConditionUnavailable):
        NONE.check("/data", cold=True)


def test_a_memory_limit_under_which_python_stalls_is_named_too(monkeypatch):
    import subprocess

    def stalls(self, argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs.get("timeout"))

    monkeypatch.setattr(StorageLimits, "__enter__", lambda self: self)
    monkeypatch.setattr(StorageLimits, "__exit__", lambda self, *exc: None)
    monkeypatch.setattr(StorageLimits, "run", stalls)
    with pytest.raises(StorageConditionUnavailable, match="did not start within 30 s under it"):
        limits_module._check_python_fits(1 << 20)
