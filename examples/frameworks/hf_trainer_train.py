"""Train a tiny ResNet on an image folder with the Hugging Face ``Trainer``: the script a Trainer user writes.

    python examples/frameworks/hf_trainer_train.py --data DIR

``DIR`` is in the ImageNet layout, ``DIR/<class>/<file>.jpg``. The model is a ``ResNetForImageClassification``
built from a small ``ResNetConfig`` (random weights: nothing is downloaded); the script's own Dataset gives
``{"pixel_values": tensor, "labels": int}`` items, and the ``Trainer`` evaluates on a held-out share of the
files at every epoch's end (every ``--eval-steps`` steps instead, with them), and saves a checkpoint every
``--save-steps`` steps where asked. ``--slow-ms`` adds a sleep to each sample, so a test can make a data-bound
run on a tiny dataset. ``--witness FILE`` appends one JSON line per training epoch to FILE, timed by the
script itself through a ``TrainerCallback``.

It is kept free of stallbench and of the ``loader`` package on purpose: it stands for a user's script that
was never changed to be measured.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _witness import time_calls
from PIL import Image
from torch.utils.data import Dataset
from transformers import (
    ResNetConfig,
    ResNetForImageClassification,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

EXTENSIONS = (".jpg", ".jpeg", ".png")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a tiny ResNet with the HF Trainer on an image folder.")
    p.add_argument("--data", required=True, type=Path, help="root/<class>/<file>.jpg")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--image-size", type=int, default=32, help="resize to this square")
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra sleep per sample, in milliseconds")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of the files held out")
    p.add_argument("--witness", type=Path, default=None, help="append one JSON line per training epoch")
    p.add_argument("--eval-steps", type=int, default=None, help="evaluate every N steps, not each epoch")
    p.add_argument("--save-steps", type=int, default=None, help="save a checkpoint every N steps")
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
    """Opens, resizes and converts one image per ``__getitem__``, as the dict a HF image model takes."""

    def __init__(self, samples: list[tuple[Path, int]], size: int, slow_ms: float = 0.0) -> None:
        self.samples, self.size, self.slow_s = samples, size, slow_ms / 1000

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        path, label = self.samples[index]
        with Image.open(path) as img:
            pixels = np.asarray(img.convert("RGB").resize((self.size, self.size), Image.Resampling.BILINEAR))
        if self.slow_s:
            time.sleep(self.slow_s)
        x = torch.from_numpy(pixels.transpose(2, 0, 1).astype(np.float32) / 255.0)
        return {"pixel_values": x, "labels": label}


def split_datasets(args: argparse.Namespace) -> tuple[JpegDataset, JpegDataset, int]:
    """Train and held-out datasets (a fixed random split of the files), and the number of classes."""
    samples, num_classes = list_images(args.data)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(0)).tolist()
    held = min(len(samples) - 1, max(1, round(len(samples) * args.val_fraction)))
    train = JpegDataset([samples[i] for i in order[held:]], args.image_size, args.slow_ms)
    return train, JpegDataset([samples[i] for i in order[:held]], args.image_size, args.slow_ms), num_classes


def tiny_resnet(num_classes: int) -> ResNetForImageClassification:
    """Two basic stages of 8 and 16 channels, randomly initialised from the config."""
    config = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=num_classes
    )
    return ResNetForImageClassification(config)


class EpochWitness(TrainerCallback):
    """Times each training epoch by hand: waiting for batches versus running training steps, and the
    evaluations and checkpoint writes made between two steps, apart from both.

    With ``gradient_accumulation_steps=1`` a step is one batch. The epoch ends at the last ``on_step_end``, so
    nothing the Trainer does after its last step (evaluation, logging) counts. An evaluation is timed as the
    training loop loses it: the gap from a step's end to the next one's start in which the Trainer evaluated,
    less the checkpoint writes in it; a checkpoint write is the trainer's ``_save_checkpoint``, timed around
    it (``watch``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = self.last = self.step_start = 0.0
        self.wait = self.step = self.evaluating = self.saving = self.saving_at_last = 0.0
        self.epoch = self.batches = self.evaluations = self.saves = self.evaluated = 0

    def watch(self, trainer: Trainer) -> None:
        """Time the trainer's checkpoint writes."""
        time_calls(trainer, "_save_checkpoint", self._saved)

    def _saved(self, seconds: float) -> None:
        self.saving += seconds
        self.saves += 1

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.epoch = int(state.epoch or 0)  # the epochs done so far: this one's index
        self.start = self.last = time.perf_counter()
        self.wait = self.step = self.evaluating = self.saving = self.saving_at_last = 0.0
        self.batches = self.evaluations = self.saves = self.evaluated = 0

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.evaluated += 1

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.step_start = time.perf_counter()
        gap = self.step_start - self.last - (self.saving - self.saving_at_last)
        if self.batches and self.evaluated:  # the Trainer evaluated since the last step's end
            self.evaluating += gap
            self.evaluations += self.evaluated
        else:
            self.wait += gap
        self.evaluated = 0

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.last = time.perf_counter()
        self.step += self.last - self.step_start
        self.batches += 1
        self.saving_at_last = self.saving

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        record = {
            "epoch": self.epoch,
            "seconds": self.last - self.start,
            "wait_seconds": self.wait,
            "step_seconds": self.step,
            "batches": self.batches,
            "evaluation": [self.evaluating, self.evaluations],
            "checkpoint": [self.saving, self.saves],
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def training_arguments(args: argparse.Namespace, output_dir: str) -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        learning_rate=1e-2,
        dataloader_num_workers=args.workers,
        eval_strategy="steps" if args.eval_steps else "epoch",
        eval_steps=args.eval_steps,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    train, held, num_classes = split_datasets(args)
    witness = EpochWitness(args.witness) if args.witness else None
    with tempfile.TemporaryDirectory(prefix="hf-trainer-") as output_dir:
        trainer = Trainer(
            model=tiny_resnet(num_classes),
            args=training_arguments(args, output_dir),
            train_dataset=train,
            eval_dataset=held,
            callbacks=[witness] if witness else [],
        )
        if witness:
            witness.watch(trainer)
        trainer.train()
    eval_loss = next(log["eval_loss"] for log in reversed(trainer.state.log_history) if "eval_loss" in log)
    print(f"done: {args.epochs} epochs, eval_loss {eval_loss:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
