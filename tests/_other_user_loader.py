"""Another user's training job on the same machine, for the leak check's test.

``_other_user_loader.py PIDFILE PID`` leaves its parent (two forks, a session of its own: no process of
the test session is its ancestor), writes its pid to PIDFILE, keeps a cache folder named as a stallbench
run's in /dev/shm, and runs torch's DataLoader with 2 workers sharing batches by name (``file_system``: a
``torch_<pid>_*`` name per batch) until killed or PID is gone."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def leave_parent() -> None:
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)


if __name__ == "__main__":
    leave_parent()
    import torch
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy("file_system")
    (Path("/dev/shm") / f"stallbench-run-{os.getpid()}-other").mkdir()
    Path(sys.argv[1]).write_text(str(os.getpid()))
    data = torch.utils.data.TensorDataset(torch.zeros(1_000, 256))
    loader = torch.utils.data.DataLoader(data, batch_size=10, num_workers=2, persistent_workers=True)
    watched = int(sys.argv[2])  # the test session's process: it ends when that one is gone
    while os.path.exists(f"/proc/{watched}"):
        for _ in loader:
            time.sleep(0.005)
