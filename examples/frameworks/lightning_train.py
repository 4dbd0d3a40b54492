"""Train a tiny CNN on an image folder with PyTorch Lightning: the script a Lightning user writes.

    python examples/frameworks/lightning_train.py --data DIR

``DIR`` is in the ImageNet layout, ``DIR/<class>/<file>.jpg``. A ``LightningDataModule`` serves plain
``torch.utils.data.DataLoader``s over the script's own Dataset (PIL decode, resize, float tensor), and the
``Trainer`` validates on a held-out share of the files at every epoch's end (and every ``--val-every``
training batches: ``val_check_interval``), and with ``--checkpoint-every N`` saves a checkpoint every N
training steps (``ModelCheckpoint``). ``--slow-ms`` adds a sleep to each sample, so a test can make a
data-bound run on a tiny dataset. ``--witness FILE`` appends one JSON line per training epoch to FILE, timed
by the script itself through a Lightning ``Callback``.

It is kept free of stallbench and of the ``loader`` package on purpose: it stands for a user's script that
was never changed to be measured.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from _witness import time_calls
from PIL import Image
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset

EXTENSIONS = (".jpg", ".jpeg", ".png")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a tiny CNN with PyTorch Lightning on an image folder.")
    p.add_argument("--data", required=True, type=Path, help="root/<class>/<file>.jpg")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--image-size", type=int, default=32, help="resize to this square")
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra sleep per sample, in milliseconds")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of the files held out")
    p.add_argument("--witness", type=Path, default=None, help="append one JSON line per training epoch")
    p.add_argument("--val-every", type=int, default=None, help="also validate every N training batches")
    p.add_argument("--checkpoint-every", type=int, default=None, help="save a checkpoint every N steps")
    p.add_argument("--checkpoints", type=Path, default=Path("checkpoints"), help="where they are saved")
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


class ImageDataModule(pl.LightningDataModule):
    """Splits the folder once into train and validation files; each dataloader is a plain DataLoader."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        samples, self.num_classes = list_images(args.data)
        order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(0)).tolist()
        held = min(len(samples) - 1, max(1, round(len(samples) * args.val_fraction)))
        self.train_set = JpegDataset([samples[i] for i in order[held:]], args.image_size, args.slow_ms)
        self.val_set = JpegDataset([samples[i] for i in order[:held]], args.image_size, args.slow_ms)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set, batch_size=self.args.batch_size, shuffle=True, num_workers=self.args.workers
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.args.batch_size, num_workers=self.args.workers)


class TinyCNN(pl.LightningModule):
    """Two conv layers and a linear head: a CPU step is short, so the data side shows."""

    def __init__(self, num_classes: int, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        accuracy = (self(x).argmax(dim=1) == y).float().mean()
        self.log("val_acc", accuracy, batch_size=len(y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class EpochWitness(pl.Callback):
    """Times each training epoch by hand: waiting for batches versus running training steps, and the
    validations and checkpoint writes made between two batches, apart from both.

    A validation is timed as the training loop loses it: from the end of the batch it follows to the start
    of the next one (Lightning starts the validation loader, and its workers, before its
    ``on_validation_start``), less the checkpoint writes in that gap; a checkpoint write is the trainer's
    ``save_checkpoint`` call, timed around it. The epoch ends at the last ``on_train_batch_end``: Lightning
    calls ``on_train_epoch_end`` only after the epoch-end validation, which is no part of the training
    iteration.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = self.last = self.step_start = 0.0
        self.wait = self.step = self.validating = self.saving = 0.0
        self.batches = self.validations = self.saves = self.validations_seen = 0
        self.saving_at_last = 0.0  # checkpoint seconds at the last batch's end

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        time_calls(trainer, "save_checkpoint", self._saved)

    def _saved(self, seconds: float) -> None:
        self.saving += seconds
        self.saves += 1

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start = self.last = time.perf_counter()
        self.wait = self.step = self.validating = self.saving = self.saving_at_last = 0.0
        self.batches = self.validations = self.saves = 0

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.validations_seen += 1

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.step_start = time.perf_counter()
        gap = self.step_start - self.last
        if self.batches and self.validations_seen:  # a validation ran since the last batch's end
            self.validating += gap - (self.saving - self.saving_at_last)
            self.validations += self.validations_seen
        else:
            self.wait += gap - (self.saving - self.saving_at_last)
        self.validations_seen = 0

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.last = time.perf_counter()
        self.step += self.last - self.step_start
        self.batches += 1
        self.saving_at_last = self.saving

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        record = {
            "epoch": trainer.current_epoch,
            "seconds": self.last - self.start,
            "wait_seconds": self.wait,
            "step_seconds": self.step,
            "batches": self.batches,
            "evaluation": [self.validating, self.validations],
            "checkpoint": [self.saving, self.saves],
        }
        self.validations_seen = 0  # the epoch-end validation is no part of the training epoch
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pl.seed_everything(0, verbose=False)
    data = ImageDataModule(args)
    callbacks: list[pl.Callback] = [EpochWitness(args.witness)] if args.witness else []
    if args.checkpoint_every:
        every = dict(every_n_train_steps=args.checkpoint_every, save_top_k=-1, save_on_train_epoch_end=False)
        callbacks.append(ModelCheckpoint(dirpath=args.checkpoints, **every))
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=bool(args.checkpoint_every),
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=args.val_every,
        callbacks=callbacks,
    )
    trainer.fit(TinyCNN(data.num_classes), datamodule=data)
    print(f"done: {args.epochs} epochs, val_acc {float(trainer.callback_metrics['val_acc']):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
