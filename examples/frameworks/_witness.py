"""What the framework examples' witnesses share: a trainer's method timed around each of its calls."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def time_calls(owner: Any, name: str, add: Callable[[float], None]) -> None:
    """From now on each call of ``owner.name`` passes its seconds to ``add``, however it ends."""
    call = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            add(time.perf_counter() - start)

    setattr(owner, name, timed)
