"""Run a command once, measured: the user's own, or a generated job (``stallbench.jobs.workload``), which is
run the same way. The bootstrap is in its Python processes, its output passed through, its whole process
tree (every torchrun rank, every DataLoader worker) inside the run's limits.

The tree runs in a cgroup where the kernel allows one (``StorageLimits``, with or without limits): closing it
kills every process the command started, whatever it did with its sessions. Elsewhere the command gets a
session of its own and the session is killed. Either way a Ctrl-C, a time limit or a failure leaves no
process, cgroup or scratch folder behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from stallbench.conditions.cgroup import StorageConditionUnavailable, StorageLimits
from stallbench.conditions.load import OtherLoad
from stallbench.jobs._process import CommandProcess
from stallbench.jobs.leftovers import JOB_PREFIX
from stallbench.jobs.run import child_env, job_tmpdir
from stallbench.jobs.spec import JOB_ENV, JobSpec, LoaderEpoch, WorkloadJob, read_records, read_targets

__all__ = ["BOOTSTRAP_DIR", "CommandFailed", "CommandRun", "StartedCommand", "run_command"]

BOOTSTRAP_DIR = Path(__file__).with_name("_bootstrap")


class CommandFailed(RuntimeError):
    """The user's command exited with an error: its exit code and the last lines it wrote."""

    def __init__(self, argv: Sequence[str], returncode: int, tail: Sequence[str]) -> None:
        self.returncode, self.tail = returncode, list(tail)
        last = "\n".join(f"    {line}" for line in tail) or "    (it wrote nothing)"
        how = f"exited with code {returncode}"
        if returncode < 0:
            how = f"was killed by {_signal_name(-returncode)}"
            how += " (the kernel's OOM killer, at a memory limit?)" if returncode == -signal.SIGKILL else ""
        super().__init__(f"the command `{' '.join(argv)}` {how}; its last lines:\n{last}")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class CommandRun:
    """One run of the command: what its processes measured, and how it ended."""

    records: tuple[LoaderEpoch, ...]
    seconds: float
    timed_out: bool
    memory_peak: int | None  # bytes charged to the run's cgroup at most (page cache included), if counted
    targets: tuple[dict, ...] = ()  # what ``stallbench.time_to_target`` reported in the run, rank 0's first
    other_load_cores: float = 0.0  # cores other work on the machine kept busy during the run (``OtherLoad``)


def run_command(
    argv: Sequence[str],
    spec: JobSpec,
    *,
    limits: StorageLimits | None = None,
    time_limit: float | None = None,
    log: IO[str] | None = None,
    job: WorkloadJob | None = None,
) -> CommandRun:
    """Run ``argv`` once under ``spec`` (its ``out_dir`` is replaced by a scratch folder, removed after),
    inside ``limits`` when given, else in a cgroup of its own where one can be made. The command's output
    goes to ``log`` (default: this process's stdout). With ``job`` (a generated job), its JSON file is the
    last argument. Raises CommandFailed when it exits with an error."""
    with StartedCommand(argv, spec, limits=limits, log=log, job=job) as started:
        return started.wait(time_limit)


class StartedCommand:
    """A run of a command started and not yet waited for, so that several run at once (``compare --jobs``).

    ``with StartedCommand(...) as c: run = c.wait()``: leaving the block (a Ctrl-C, a failure elsewhere)
    kills the command's whole session, closes its cgroup and removes its scratch folder."""

    def __init__(
        self,
        argv: Sequence[str],
        spec: JobSpec,
        *,
        limits: StorageLimits | None = None,
        log: IO[str] | None = None,
        job: WorkloadJob | None = None,
    ) -> None:
        self._stack = contextlib.ExitStack()
        self.out = Path(tempfile.mkdtemp(prefix=f"{JOB_PREFIX}-{os.getpid()}-"))
        self._stack.callback(shutil.rmtree, self.out, ignore_errors=True)
        try:
            tmp = job_tmpdir()  # the command's TMPDIR, short enough for a worker's socket below it
            self._stack.callback(shutil.rmtree, tmp, ignore_errors=True)
            self.argv = [*argv, str(job.write(self.out / "workload.json"))] if job is not None else list(argv)
            spec_file = replace(spec, out_dir=str(self.out)).write(self.out / "spec.json")
            self.cgroup = self._stack.enter_context(_limits(limits))
            self._load = OtherLoad().__enter__()  # left in ``wait``, where the run ends
            self.start = time.perf_counter()
            self._process = CommandProcess(self.argv, _env(spec_file, tmp), self.cgroup, log)
            self._stack.callback(self._process.kill)
        except BaseException:
            self._stack.close()
            raise

    def __enter__(self) -> StartedCommand:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""
        return self._process.proc.poll()

    def wait(self, time_limit: float | None = None) -> CommandRun:
        """Until the command ends (stopped at ``time_limit`` seconds from its start): what it measured."""
        left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - self.start))
        returncode, tail, timed_out = self._process.wait(left)
        seconds = time.perf_counter() - self.start
        peak = _peak(self.cgroup)
        self._load.__exit__(None, None, None)
        if returncode != 0 and not timed_out:
            raise CommandFailed(self.argv, returncode, tail)
        records, targets = tuple(read_records(self.out)), tuple(read_targets(self.out))
        return CommandRun(records, seconds, timed_out, peak, targets, self._load.cores)


@contextlib.contextmanager
def _limits(limits: StorageLimits | None) -> Iterator[StorageLimits | None]:
    """The run's cgroup: ``limits`` (entered here unless already active), or a plain one that only counts
    and sweeps; None where the kernel lets us make none."""
    if limits is not None and limits.paths:
        yield limits
        return
    try:
        cgroup = limits if limits is not None else StorageLimits()
        cgroup.__enter__()
    except (StorageConditionUnavailable, OSError):
        if limits is not None:
            raise
        yield None
        return
    try:
        yield cgroup
    finally:
        cgroup.close()


def _env(spec_file: Path, tmp: str) -> dict[str, str]:
    """This environment, with the bootstrap and stallbench importable first, the spec named and ``tmp`` as
    ``TMPDIR`` (a killed worker's pymp-* folder goes with it)."""
    return {**child_env(tmp, first=[BOOTSTRAP_DIR]), JOB_ENV: str(spec_file), "PYTHONUNBUFFERED": "1"}


def _peak(cgroup: StorageLimits | None) -> int | None:
    if cgroup is None:
        return None
    try:
        return cgroup.memory_max_usage()
    except StorageConditionUnavailable:
        return None
