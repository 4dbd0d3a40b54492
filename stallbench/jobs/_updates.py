"""The optimizer updates the user's process makes, counted where torch makes them: ``optimizer.step()``.

A batch is not an update: with gradient accumulation (the Hugging Face Trainer's
``gradient_accumulation_steps``, Lightning's ``accumulate_grad_batches``, accelerate's) a step comes every
few batches, and AMP's ``GradScaler`` skips the step of a batch whose gradients overflowed. torch calls its
global step hooks around every optimizer's ``step``; a wrapper whose ``step`` calls its inner optimizer's
(accelerate's ``AcceleratedOptimizer``) is counted once: only a step that no other step encloses.
"""

from __future__ import annotations

from typing import Any

__all__ = ["optimizer_steps", "watch_optimizers"]

_count = {"steps": 0, "depth": 0, "watching": False}


def watch_optimizers() -> None:
    """Count every ``optimizer.step()`` of this process from now on (once; torch is imported by then)."""
    if _count["watching"]:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_entered)
    register_optimizer_step_post_hook(_left)
    _count["watching"] = True


def optimizer_steps() -> int | None:
    """Steps made so far, or None where no optimizer has stepped in this process (nothing to count)."""
    return _count["steps"] or None


def _entered(optimizer: Any, args: Any, kwargs: Any) -> None:
    _count["depth"] += 1


def _left(optimizer: Any, args: Any, kwargs: Any) -> None:
    _count["depth"] = max(0, _count["depth"] - 1)
    if _count["depth"] == 0:
        _count["steps"] += 1
