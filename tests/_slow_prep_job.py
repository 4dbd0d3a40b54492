"""A job whose prep is slow on purpose (10 ms per record), for the phase tests."""

from __future__ import annotations

import sys
import time

from stallbench.jobs.workload import main


def slow_prep(raw: bytes) -> int:
    time.sleep(0.01)
    return len(raw)


if __name__ == "__main__":
    sys.exit(main(transform=slow_prep))
