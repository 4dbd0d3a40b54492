"""Train a tiny CNN on an image folder with Hugging Face Accelerate: the plain loop an Accelerate user writes.

    python examples/frameworks/accelerate_train.py --data DIR

``DIR`` is in the ImageNet layout, ``DIR/<class>/<file>.jpg``. The model, optimizer and two plain
``torch.utils.data.DataLoader``s over the script's own Dataset (PIL decode, resize, float tensor) go through
``Accelerator.prepare``; each epoch trains, then evaluates on a held-out share of the files. ``--slow-ms``
adds a sleep to each sample, so a test can make a data-bound run on a tiny dataset. ``--witness FILE``
appends one JSON line per training epoch to FILE, timed by the loop itself.

It is kept free of stallbench and of the ``loader`` package on purpose: it stands for a user's script that
was never changed to be measured.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

EXTENSIONS = (".jpg", ".jpeg", ".png")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a tiny CNN with Accelerate on an image folder.")
    p.add_argument("--data", required=True, type=Path, help="root/<class>/<file>.jpg")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--image-size", type=int, default=32, help="resize to this square")
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra sleep per sample, in milliseconds")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of the files held out")
    p.add_argument("--witness", type=Path, default=None, help="append one JSON line per training epoch")
    p.add_argument("--accumulate", type=int, default=1, help="batches per optimizer update")
    return p.parse_args(argv)


def list_images(root: Path) -> tuple[list[tuple[Path, int]], int]:
    """(path, label) of every image, labels from the sorted class folder names, and the number of classes."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    samples = [
        (path, label)
        for label, name in enumerate(classes)
        for path in sorted((root / name).iterdir())
        if path.suffix.lower() in EXTENSIONS
    ]
    if not samples:
        raise SystemExit(f"no images under {root} (expected {root}/<class>/<file>.jpg)")
    return samples, len(classes)


class JpegDataset(Dataset):
    """Opens, resizes and converts one image per ``__getitem__``."""

    def __init__(self, samples: list[tuple[Path, int]], size: int, slow_ms: float = 0.0) -> None:
        self.samples, self.size, self.slow_s = samples, size, slow_ms / 1000

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with Image.open(path) as img:
            pixels = np.asarray(img.convert("RGB").resize((self.size, self.size), Image.Resampling.BILINEAR))
        if self.slow_s:
            time.sleep(self.slow_s)
        x = torch.from_numpy(pixels.transpose(2, 0, 1).astype(np.float32) / 255.0)
        return x, label


def make_loaders(args: argparse.Namespace) -> tuple[DataLoader, DataLoader, int]:
    """Train and held-out loaders over a fixed random split of the files, and the number of classes."""
    samples, num_classes = list_images(args.data)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(0)).tolist()
    held = min(len(samples) - 1, max(1, round(len(samples) * args.val_fraction)))
    train = JpegDataset([samples[i] for i in order[held:]], args.image_size, args.slow_ms)
    val = JpegDataset([samples[i] for i in order[:held]], args.image_size, args.slow_ms)
    common = {"batch_size": args.batch_size, "num_workers": args.workers}
    return DataLoader(train, shuffle=True, **common), DataLoader(val, **common), num_classes


def tiny_cnn(num_classes: int) -> nn.Module:
    """Two conv layers and a linear head: a CPU step is short, so the data side shows."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, num_classes),
    )


def train_epoch(
    accelerator: Accelerator, model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader
) -> dict[str, float]:
    """One pass over ``loader``, hand-timed: time waiting for each batch versus time in training steps, and
    the optimizer updates made (one per ``gradient_accumulation_steps`` batches)."""
    model.train()
    wait = step = 0.0
    batches = updates = 0
    start = last = time.perf_counter()
    for x, y in loader:
        step_start = time.perf_counter()
        wait += step_start - last
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            updates += accelerator.sync_gradients
        last = time.perf_counter()
        step += last - step_start
        batches += 1
    timing = {"seconds": last - start, "wait_seconds": wait, "step_seconds": step}
    return {**timing, "batches": batches, "updates": updates}


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: nn.Module, loader: DataLoader) -> float:
    """Accuracy over the held-out loader."""
    model.eval()
    correct = seen = 0
    for x, y in loader:
        pred, y = accelerator.gather_for_metrics((model(x).argmax(dim=1), y))
        correct, seen = correct + int((pred == y).sum()), seen + len(y)
    return correct / max(seen, 1)


def write_witness(path: Path, epoch: int, timing: dict[str, float]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"epoch": epoch, **timing}) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    train_dl, eval_dl, num_classes = make_loaders(args)
    model = tiny_cnn(num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)
    accuracy = 0.0
    for epoch in range(args.epochs):
        timing = train_epoch(accelerator, model, optimizer, train_dl)
        if args.witness and accelerator.is_main_process:
            write_witness(args.witness, epoch, timing)
        accuracy = evaluate(accelerator, model, eval_dl)
    accelerator.print(f"done: {args.epochs} epochs, eval accuracy {accuracy:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
