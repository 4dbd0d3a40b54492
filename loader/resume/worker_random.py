"""Each worker's random state, kept with the batches it makes, so that a resumed epoch draws the same
augmentation as the saved job went on to draw.

Torch seeds ``random``, ``torch`` and ``numpy`` in every worker, and each worker then draws from them batch
after batch: workers started again (a restarted job, or any new iterator of a restored loader) would start
their streams over, and a transform that draws from them (a random crop, a flip) would give other pixels for
the same records. So each batch a worker makes carries the three states as that batch left them
(:class:`Stamped`); the loader keeps, per worker, the one of the last batch handed to the training loop, its
``state_dict`` holds them, and a restored loader's workers take them up before their first batch, each given
the batches the saved worker would have made next (torch deals batches to workers in turn; the turn is
resumed where the saved epoch stood). A stamp is at most 10 kB of bytes a batch, only the modules whose state
changed (2.5 kB for a transform that draws from ``random`` alone), ~50 us to take in the worker; it travels
with the batch and is dropped before the training loop sees it. Nothing changes what a loader that is not
restored draws.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.pin_memory import pin_memory

from loader.transport.orphan_guard import guard_orphan

__all__ = [
    "RandomStates",
    "RestoringWorkerInit",
    "Stamped",
    "StampingCollate",
    "random_states",
    "set_random_states",
]

# bytes, lists and numbers only: cheap to send with a batch (a tensor would go through shared memory), and
# ``torch.load`` reads them back as weights
RandomStates = dict[str, Any]


def random_states() -> RandomStates:
    """This process's states of ``torch``, ``random`` and ``numpy``'s global generators."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state().numpy().tobytes(),
        "random": [version, np.asarray(internal, dtype=np.uint32).tobytes(), gauss],
        "numpy": [kind, keys.astype(np.uint32).tobytes(), pos, has_gauss, cached],
    }


def set_random_states(states: RandomStates) -> None:
    """Make this process's generators draw on from ``states`` (``random_states()``'s)."""
    torch.set_rng_state(torch.frombuffer(bytearray(states["torch"]), dtype=torch.uint8))
    version, internal, gauss = states["random"]
    random.setstate((version, tuple(np.frombuffer(internal, dtype=np.uint32).tolist()), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.frombuffer(keys, dtype=np.uint32).copy(), pos, has_gauss, cached))


class Stamped:
    """A batch as a worker sends it: with the worker's id and its random states as the batch left them (those
    that changed since its last stamp)."""

    __slots__ = ("batch", "states", "worker")

    def __init__(self, batch: Any, worker: int, states: RandomStates) -> None:
        self.batch, self.worker, self.states = batch, worker, states

    def __reduce__(self) -> tuple[Any, ...]:
        return Stamped, (self.batch, self.worker, self.states)

    def pin_memory(self) -> Stamped:
        """What torch's pin-memory thread calls: the batch pinned, the stamp kept."""
        return Stamped(pin_memory(self.batch), self.worker, self.states)


class StampingCollate:
    """The loader's ``collate_fn`` in its workers: the batch, stamped with the worker's random states that
    changed since its last stamp (a module the transform does not draw from is sent once: a stamp of our
    ``"train"`` transform is ``random``'s 2.5 kB). A worker that stamps leaves once its loader's process is
    gone (``guard_orphan``, started with its first batch)."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate
        self._sent: RandomStates = {}  # this worker's last states sent (each worker has its own copy)
        self._guarded = False

    def __call__(self, samples: Any) -> Any:
        batch = self.collate(samples)
        info = get_worker_info()
        if info is None:
            return batch
        if not self._guarded:
            self._guarded = True
            guard_orphan()
        states = random_states()
        changed = {name: value for name, value in states.items() if self._sent.get(name) != value}
        self._sent = states
        return Stamped(batch, info.id, changed)


class RestoringWorkerInit:
    """A restored loader's ``worker_init_fn``: the one it had, then the random states the saved worker of the
    same id had left off at (none: the fresh seeds, as the saved worker started)."""

    def __init__(self, states: dict[int, RandomStates], user_init: Callable[[int], Any] | None) -> None:
        self.states, self.user_init = states, user_init

    def __call__(self, worker_id: int) -> None:
        if self.user_init is not None:
            self.user_init(worker_id)
        if worker_id in self.states:
            set_random_states(self.states[worker_id])
