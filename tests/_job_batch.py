"""Many restart cases through one job script, one new process each way: every case saved by one process and
restored by another, as users restart, without a Python and torch start per case and per side.

The job's side (:func:`job_main`): ``JOB.py batch MODE CASES`` reads CASES (JSON: each case's name and, per
mode, the arguments its single-case command line takes after MODE), and runs the job's ``main(MODE, ...)`` for
each case in turn, from random states seeded anew as a new process's are. A case that fails has its traceback
written to the mode's error file (:func:`errors_file`), and the cases after it go on.

The test's side (:class:`Restarts`): lists the cases, runs the two processes the first time any case's outcome
is asked for (inside that test, whose checks on what processes leave behind see them), and answers each case
with what its saving and its restoring process recorded, or a failure that names the case and says why.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["MODES", "OUT", "STATE", "Restarts", "errors_file", "job_main"]

MODES = ("save", "load")  # the saving process runs first; then the restoring one, new
STATE, OUT = "<state>", "<out>"  # in a case's arguments: its state file; the mode's output file


def errors_file(cases_file: Path, mode: str) -> Path:
    """Where a batch of ``mode`` records its failed cases: {name: traceback}."""
    return cases_file.with_name(f"{mode}-errors.json")


def job_main(main: Callable[..., None], argv: Sequence[str]) -> None:
    """A job script's command line: ``batch MODE CASES`` runs every case listed; anything else is one case's
    arguments, as before."""
    if argv[:1] == ["batch"]:
        _run_cases(main, *argv[1:])
    else:
        main(*argv)


def _run_cases(main: Callable[..., None], mode: str, cases_file: str) -> None:
    cases, errors = json.loads(Path(cases_file).read_text()), {}
    for name, arguments in cases.items():
        print(f"{mode} {name}", file=sys.stderr, flush=True)  # which case a killed batch was in
        _seed_as_a_new_process()
        try:
            main(mode, *arguments[mode])
        except Exception:  # recorded against its case; the others go on
            errors[name] = traceback.format_exc()
            print(errors[name], file=sys.stderr, flush=True)
            errors_file(Path(cases_file), mode).write_text(json.dumps(errors))


def _seed_as_a_new_process() -> None:
    """Seed ``torch``, ``random`` and ``numpy``'s global generators from the system's entropy, as each is in a
    new process: no case starts from the states the cases before it left."""
    torch.seed()
    random.seed()
    np.random.seed()


@dataclass(frozen=True)
class _Run:
    """How one batch process ended: its exit status (None: killed at its timeout) and its stderr."""

    status: int | None
    stderr: str


class Restarts:
    """The restart cases of a test module, each in a folder of its own under ``root``, run through ``job``
    in two new processes (each killed at ``timeout`` seconds) when an outcome is first asked for."""

    def __init__(self, job: Path, root: Path, timeout: float) -> None:
        self.job, self.root, self.timeout = job, root, timeout
        self.cases_file = root / "cases.json"
        self.cases: dict[str, dict[str, list[str]]] = {}
        self._runs: dict[str, _Run] | None = None

    def folder(self, name: str) -> Path:
        """Case ``name``'s own folder (made): its state, its outputs, any data it reads."""
        path = self.root / name
        path.mkdir(exist_ok=True)
        return path

    def add(self, name: str, save: Sequence[object], load: Sequence[object] | None = None) -> None:
        """Case ``name``: the arguments of its save and of its load (the same where not given), with
        ``STATE`` and ``OUT`` standing for its state file and the mode's output file."""
        if name in self.cases:
            raise ValueError(f"case {name!r} is listed twice")
        state = self.folder(name) / "state.pt"
        arguments = {"save": save, "load": save if load is None else load}
        self.cases[name] = {
            mode: [str({STATE: state, OUT: self._out(name, mode)}.get(a, a)) for a in arguments[mode]]
            for mode in MODES
        }

    def outcome(self, name: str) -> tuple[Any, Any]:
        """What case ``name``'s saving process recorded and what its restoring process did (JSON); the two
        processes run first where they have not. AssertionError naming the case where either has nothing."""
        if name not in self.cases:
            raise KeyError(f"no case {name!r}; listed: {sorted(self.cases)}")
        if self._runs is None:
            self.cases_file.write_text(json.dumps(self.cases))
            self._runs = {mode: self._run(mode) for mode in MODES}
        saved, restored = (self._read(name, mode, self._runs[mode]) for mode in MODES)
        return saved, restored

    def _out(self, name: str, mode: str) -> Path:
        return self.root / name / ("saved.json" if mode == "save" else "restored.json")

    def _run(self, mode: str) -> _Run:
        paths = os.pathsep.join([str(self.job.parent), str(self.job.parent.parent)])  # tests/, the repository
        env = {**os.environ, "PYTHONPATH": paths}
        command = [sys.executable, str(self.job), "batch", mode, str(self.cases_file)]
        try:  # run() kills the process whatever ends the wait: its timeout, an interrupt
            done = subprocess.run(command, env=env, timeout=self.timeout, stderr=subprocess.PIPE, text=True)
        except subprocess.TimeoutExpired as killed:
            stderr = killed.stderr or b""
            return _Run(None, stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr)
        return _Run(done.returncode, done.stderr)

    def _read(self, name: str, mode: str, run: _Run) -> Any:
        where = f"case {name!r}: the {mode} process ({self.job.name} batch {mode})"
        errors_at = errors_file(self.cases_file, mode)
        errors = json.loads(errors_at.read_text()) if errors_at.exists() else {}
        if name in errors:
            raise AssertionError(f"{where} failed on this case:\n{errors[name]}")
        stderr = f"its stderr ended:\n{run.stderr[-4000:]}"
        if run.status != 0:
            ended = f"ran past {self.timeout} s" if run.status is None else f"exited with status {run.status}"
            raise AssertionError(f"{where} {ended}; {stderr}")
        out = self._out(name, mode)
        if not out.exists():
            raise AssertionError(f"{where} recorded nothing for this case; {stderr}")
        return json.loads(out.read_text())
