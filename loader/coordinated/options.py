"""What ``coordinate=`` accepts, and the group key that decides which jobs share their batches."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import re
from typing import Any, Literal

from loader.coordinated._state import ACTIVE, PENDING

__all__ = ["Coordination", "CoordinationStats", "CoordinationWarning", "coordination_from", "group_key"]


class CoordinationWarning(RuntimeWarning):
    """A job left its group (it fell behind, or came too late for this epoch) and prepares its own batches."""


@dataclasses.dataclass(frozen=True)
class Coordination:
    """How a job shares prepared batches with the other jobs of its group (``DataLoader(coordinate=...)``).

    group: a name added to the group key (jobs with different names never share); None: the key alone.
    staged_batches: the most batches staged at once in shared memory, and how far the fastest job may run
        ahead of the slowest (at most one epoch).
    min_members: the first epoch waits (at most ``join_timeout`` seconds) until this many jobs have joined.
    patience: the longest one job, stopped, slow or dead, holds the others: a batch it claimed is taken over
        after it, and a job that holds the group back by ``staged_batches`` for longer is detached;
        ``on_lag="wait"`` never detaches (claims are still taken over).
    staging_dir: where the staging area lives; None (default): where caches live by default
        (``loader.system.home``: a local disk, whose pages the kernel takes back before it would kill a
        job; a batch consumed and removed within seconds never reaches the disk).
    """

    group: str | None = None
    staged_batches: int = 16
    min_members: int = 1
    join_timeout: float = 60.0
    patience: float = 30.0
    on_lag: Literal["detach", "wait"] = "detach"
    staging_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("staged_batches", "min_members"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Coordination.{name} must be a whole number of 1 or more, got {value!r}")
        for name in ("join_timeout", "patience"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) < 0:
                raise ValueError(
                    f"Coordination.{name} must be seconds (0 or more), got {getattr(self, name)!r}"
                )
        if self.on_lag not in ("detach", "wait"):
            raise ValueError(f"Coordination.on_lag must be 'detach' or 'wait', got {self.on_lag!r}")


@dataclasses.dataclass(frozen=True)
class CoordinationStats:
    """One job's part in its group: batches it prepared and consumed, and the prep CPU the sharing saved it
    (the CPU seconds other jobs spent on the batches it consumed). ``status`` is ``member``, ``waiting``
    (came mid-epoch: joins at the next epoch) or ``alone: <why>``."""

    group: str
    status: str
    members: int
    batches_prepared: int
    batches_consumed: int
    prep_cpu_seconds: float
    prep_cpu_saved_seconds: float

    @classmethod
    def of_row(cls, group: str, row: Any, state: Any, alone_why: str) -> CoordinationStats:
        """A member's figures from its ``row`` of the group's table (``state``: a ``_state.State``)."""
        status = {ACTIVE: "member", PENDING: "waiting"}.get(int(row["status"]), f"alone: {alone_why}")
        members = int(state.subscribed().sum())
        return cls(
            group,
            status,
            members,
            int(row["prepared"]),
            int(row["consumed"]),
            float(row["prep_cpu"]),
            float(row["cpu_saved"]),
        )


class PrepFailed(RuntimeError):
    """A batch of the group could not be prepared (the message has the preparer's error): no job gets it."""


def coordination_from(value: Any) -> Coordination | None:
    """``coordinate=`` as a Coordination: True (defaults), a group name, a Coordination; False/None: off."""
    if value is None or value is False:
        return None
    if value is True:
        return Coordination()
    if isinstance(value, str) and value:
        return Coordination(group=value)
    if isinstance(value, Coordination):
        return value
    raise ValueError(f"coordinate must be True, False, a group name or a loader.Coordination, got {value!r}")


def group_key(
    data_identity: str, *, order: str, batch_size: Any, transform: Any, collate_fn: Any, name: str | None
) -> str:
    """A name for the staging area: a hash of everything two jobs must agree on to share a batch."""
    parts = [data_identity, order, repr(batch_size), _identity(transform), _identity(collate_fn), name or ""]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    return f"stallbench-coord-{os.geteuid()}-{digest}"


def _identity(obj: Any) -> str:
    """What a transform or collate function is, the same in every process: its qualified name and, for an
    object with a repr of its own (a dataclass, torchvision's Compose), that repr without memory addresses."""
    if obj is None:
        return "None"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj):
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}:" + re.sub(r" at 0x[0-9a-f]+", "", repr(obj))
