"""The fetch-bound job of bench_fetch_bound.py: epochs of one loader over an image folder, no decode.

The transform returns the record's length, so the epoch time is the time to fetch the bytes. Run inside a
cgroup by the benchmark; measured by the bootstrap as any generated job is (see ``stallbench.jobs.workload``).
"""

from __future__ import annotations

import sys

from stallbench.jobs.workload import main


def record_length(raw: bytes) -> int:
    """The sample: how many bytes the record has (the job is bound by fetching, not decoding)."""
    return len(raw)


if __name__ == "__main__":
    sys.exit(main(transform=record_length))
