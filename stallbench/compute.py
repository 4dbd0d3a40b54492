"""Training-step models: what the loop does with each batch while the loader prepares the next.

- ``emulated:<ms>``: sleeps ``ms`` per batch, leaving the CPU free, as a GPU step would.
- ``emulated-tokens:<ms>``: sleeps ``ms`` per 1,000 token slots of a token batch (padded or packed, see
  ``stallbench.batches``), as a transformer step's cost follows the tokens it computes on, padding included:
  the model under which packing's gain shows. Linear in the slots (a model whose MLPs dominate; attention's
  quadratic term is left out).
- ``cpu``: a small real torch model (conv + pool + linear, forward, backward, SGD) on the CPU.
- ``cuda``: the same model on a CUDA device, timed with synchronisation.

Models are picked by name (``parse_compute``); an unknown name is a ValueError listing the choices.
``check_compute`` checks a name without building its model, and imports torch only to ask for a CUDA
device: stallbench's own process checks ``--compute`` at once and never needs torch otherwise (1.6 s), so
torch is imported where a step is built or run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["COMPUTE_MODELS", "ComputeStep", "check_compute", "parse_compute"]


class ComputeStep:
    """One training step per call; ``name`` says which model, for reports."""

    name = "none"

    def __call__(self, batch: Any) -> None:
        raise NotImplementedError


class EmulatedStep(ComputeStep):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.name = f"emulated:{seconds * 1000:g}"

    def __call__(self, batch: Any) -> None:
        time.sleep(self.seconds)


class TokenStep(ComputeStep):
    """Sleeps ``seconds_per_slot`` for each token slot of the batch, padding included."""

    def __init__(self, ms_per_1k: float) -> None:
        self.seconds_per_slot = ms_per_1k / 1e6
        self.name = f"emulated-tokens:{ms_per_1k:g}"

    def __call__(self, batch: Any) -> None:
        from stallbench.batches import batch_tokens

        tokens = batch_tokens(batch)
        if tokens is None:
            raise ValueError(f"compute model {self.name!r} needs token batches (padded or packed)")
        time.sleep(tokens.slots * self.seconds_per_slot)


class TorchModelStep(ComputeStep):
    """A small image classifier trained on the batch; images are uint8 NCHW tensors."""

    def __init__(self, device: str, num_classes: int = 1000) -> None:
        import torch
        from torch import nn

        self.device = torch.device(device)
        self.name = device
        self.model = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=7, stride=4),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, num_classes),
        ).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def __call__(self, batch: Any) -> None:
        import torch
        from torch import nn

        images, labels = _images_and_labels(batch, self.name)
        images = images.to(self.device, non_blocking=True).float().div_(255)
        labels = labels.to(self.device, non_blocking=True) % self.model[-1].out_features
        loss = nn.functional.cross_entropy(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _images_and_labels(batch: Any, model: str) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    if isinstance(batch, (list, tuple)) and len(batch) == 2 and isinstance(batch[0], torch.Tensor):
        images, labels = batch
        if images.dim() == 4 and images.shape[1] == 3:
            return images, torch.as_tensor(labels)
    raise ValueError(f"compute model {model!r} needs (images NCHW with 3 channels, labels) batches")


def _milliseconds(arg: str, example: str) -> float:
    try:
        ms = float(arg)
    except ValueError:
        ms = -1.0
    if not 0 <= ms < float("inf"):
        raise ValueError(f"emulated compute needs milliseconds, as in {example!r}; got {arg!r}")
    return ms


def _emulated(arg: str) -> ComputeStep:
    return EmulatedStep(_milliseconds(arg, "emulated:20") / 1000)


def _emulated_tokens(arg: str) -> ComputeStep:
    return TokenStep(_milliseconds(arg, "emulated-tokens:0.5"))


def _cuda(arg: str) -> ComputeStep:
    _check_cuda()
    return TorchModelStep("cuda")


def _check_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise ValueError("compute model 'cuda' needs a CUDA device and none is available here")


COMPUTE_MODELS: dict[str, Callable[[str], ComputeStep]] = {
    "emulated": _emulated,
    "emulated-tokens": _emulated_tokens,
    "cpu": lambda arg: TorchModelStep("cpu"),
    "cuda": _cuda,
}
_TORCH_MODELS = ("cpu", "cuda")


def check_compute(text: str) -> None:
    """ValueError, naming the choices, unless ``text`` names a compute model this machine can run."""
    name, arg = _name_and_argument(text)
    if name == "cuda":
        _check_cuda()
    elif name not in _TORCH_MODELS:
        COMPUTE_MODELS[name](arg)  # a sleep: built, to check its milliseconds


def parse_compute(text: str) -> ComputeStep:
    """``"emulated:20"``, ``"emulated-tokens:0.5"``, ``"cpu"`` or ``"cuda"`` -> a step; anything else ->
    ValueError naming the choices."""
    name, arg = _name_and_argument(text)
    return COMPUTE_MODELS[name](arg)


def _name_and_argument(text: str) -> tuple[str, str]:
    name, _, arg = text.partition(":")
    if name not in COMPUTE_MODELS:
        raise ValueError(
            f"unknown compute model {text!r}; choose one of: emulated:<ms>, emulated-tokens:<ms>, cpu, cuda"
        )
    return name, arg
