"""The example script's workload as a generated job: its own decode, resize, flip and normalise as the
transform, its own CNN and SGD step as the compute. ``bench_user_job.py`` analyzes this and the example
itself (through the bootstrap) and compares the two splits."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_cnn

from stallbench.jobs.workload import main

SIZE = 32


def transform(raw: bytes) -> torch.Tensor:
    """What the example's ``ImageFolderDataset.__getitem__`` does, from the record's bytes."""
    with Image.open(io.BytesIO(raw)) as img:
        pixels = np.asarray(img.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR))
    if torch.rand(1).item() < 0.5:
        pixels = pixels[:, ::-1]
    x = (pixels.astype(np.float32) / 255.0 - train_cnn._MEAN) / train_cnn._STD
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


class ExampleStep:
    """The example's training step: forward, cross-entropy, backward, SGD (momentum 0.9)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = train_cnn.SmallCNN(num_classes=10)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.02, momentum=0.9)

    def __call__(self, batch: Any) -> None:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


if __name__ == "__main__":
    sys.exit(main(transform=transform, step=ExampleStep()))
