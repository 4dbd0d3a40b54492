"""Ending the user's process once it has run the epochs it was asked for (``JobSpec.epochs``): as the script's
own end would, less the interpreter's teardown of its modules."""

from __future__ import annotations

import contextlib
import functools
import gc
import io
import os
import sys

__all__ = ["end_process", "exit_quickly"]

_ended_by = [0]  # the pid of the process ``end_process`` ended (a fork's child is not it)


def end_process() -> None:
    """End this process as a job that has run its epochs: ``SystemExit(0)``, as the script's own end would,
    and then, measured, ``exit_quickly`` once the exit handlers have run. Under ``torch.distributed``,
    ``os._exit(0)`` once the output is flushed: finalising the interpreter with a live process group can
    abort the rank (gloo: "terminate called without an active exception", exit -6), and every rank stops at
    this same point, past its last collective."""
    _ended_by[0] = os.getpid()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)
    raise SystemExit(0)


def exit_quickly() -> None:
    """The last exit handler, in a process ``end_process`` ended: flush the files the script left open, then
    ``os._exit(0)``. The script's own exit handlers have run; what is skipped is the interpreter's teardown of
    its modules, ~0.9 s once an optimizer has imported ``torch._dynamo``, on every run. The status is 0, as
    this run ended it: a script that turned that SystemExit into another code is not measured past its
    epochs anyway."""
    if _ended_by[0] != os.getpid():
        return
    _flush_open_files()
    os._exit(0)


def _flush_open_files() -> None:
    """Flush every file object still open, as the interpreter's teardown would when it closes them."""
    is_file = functools.cache(lambda kind: issubclass(kind, io.IOBase))
    for obj in gc.get_objects():
        if is_file(type(obj)):  # by type: a lazy module's ``__class__`` warns when read
            with contextlib.suppress(Exception):
                if not obj.closed:
                    obj.flush()
