"""A user script that leaves a file open, registers an exit handler and keeps an object with a finaliser:
what a process ended by stallbench must still honour (tests/test_bootstrap.py)."""

import atexit
import os
import sys

from torch.utils.data import DataLoader

log = open(sys.argv[1], "w")  # noqa: SIM115 (never closed: its last writes sit in its buffer)
atexit.register(lambda: log.write("exit handler ran\n"))


class Teardown:
    def __del__(self, write=os.write) -> None:  # bound now: the module's globals are gone by then
        write(2, b"module teardown\n")


kept = Teardown()
for epoch in range(5):
    for batch in DataLoader(range(8), batch_size=4):
        log.write(f"epoch {epoch} batch {batch.tolist()}\n")
