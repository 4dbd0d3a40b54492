"""What a DataLoader worker that died left of torch's shared memory in /dev/shm, removed.

With torch's ``file_descriptor`` sharing strategy (Linux's default) a worker names each segment it makes
``torch_<its pid>_...`` and unlinks it as soon as it is mapped, passing on only its descriptor; a worker
killed in between leaves the name for good, which torch's loader leaves too. Torch has no such clean-up.
"""

from __future__ import annotations

import os
from typing import Any

import torch.multiprocessing

__all__ = ["forget_segments_of_failed"]

SHM = "/dev/shm"


def forget_segments_of_failed(workers: Any) -> None:
    """Remove the names each of ``workers`` that failed (exited and reaped, not with 0) left in /dev/shm: only
    this user's, and only under the ``file_descriptor`` strategy (under ``file_system`` a name outlives its
    maker while other processes map it)."""
    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return
    failed = [w for w in workers if w.exitcode not in (None, 0) and not hasattr(w, "_segments_forgotten")]
    if not failed:
        return
    for worker in failed:  # once: torch shuts its workers down more than once, and a reaped pid is reused
        worker._segments_forgotten = True
    prefixes = tuple(f"torch_{w.pid}_" for w in failed)
    try:
        entries = [e for e in os.scandir(SHM) if e.name.startswith(prefixes)]
    except OSError:
        return
    for entry in entries:
        try:
            ours = entry.stat(follow_symlinks=False).st_uid == os.geteuid()
            if ours and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
        except OSError:  # gone already, or not ours to remove
            pass
