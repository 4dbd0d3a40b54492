"""Imported at start-up by every Python process of a command that ``stallbench analyze -- ...`` runs: the
parent puts this folder first on ``PYTHONPATH``.

It stays tiny and imports nothing heavy (never torch): a process of the command that loads no data pays next
to nothing. It first runs the ``sitecustomize`` that Python would have imported without this one (a
virtualenv's, a distribution's), then, when ``STALLBENCH_JOB`` names a job, installs the measuring
(``stallbench.jobs.child``). Whatever fails here, the user's command runs on, unmeasured, after one line on
stderr: a measurement must never be the reason a training run dies.
"""

import os
import sys

__all__: list[str] = []


def _chain() -> None:
    """Run the ``sitecustomize`` that Python would have found after this one. Only the entries after this
    folder are searched: the ones before it had none, and a second bootstrap further on, which chains in
    its turn, must not find this one again."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    try:
        entries = [(p, os.path.realpath(p or os.curdir)) for p in sys.path]
        reals = [real for _, real in entries]
        after = reals.index(here) + 1 if here in reals else 0
        path = [p for p, real in entries[after:] if real != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    except Exception as exc:
        print(f"stallbench: cannot look for another sitecustomize ({exc!r})", file=sys.stderr)
        return
    if spec is None or spec.loader is None:
        return
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as exc:  # as Python's own site does: say so and start anyway
        print(f"Error in sitecustomize {spec.origin}: {exc!r}", file=sys.stderr)


def _start() -> None:
    if not os.environ.get("STALLBENCH_JOB"):
        return
    try:
        from stallbench.jobs import child
    except Exception as exc:
        print(f"stallbench: cannot import its measuring code ({exc!r}); running unmeasured", file=sys.stderr)
        return
    try:
        child.install()
    except Exception as exc:
        print(f"stallbench: cannot start measuring ({exc!r}); running unmeasured", file=sys.stderr)


_chain()
_start()
