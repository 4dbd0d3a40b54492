"""The time-to-target job of bench_time_to_target.py: a small CNN trained on the CPU to a held-out accuracy.

``_target_job.py make ROOT`` writes the data once: 10 classes of 500x375 JPEGs that a small CNN can tell
apart (each class its own tint and stripe angle, under noise), ``ROOT/train`` and ``ROOT/held``. Each image
varies its tint, angle and stripe period a little around its class's, so the held-out accuracy counts
images: with every image of a class alike, the net named each class right or wrong whole, and the accuracy
moved in steps of 0.1, a sample of 10 in which a pixel's difference could move the target an epoch.

``_target_job.py torch|ours ROOT CACHE_DIR TARGET MAX_EPOCHS SEED`` trains on random resized crops of 80 px
(``TrainTransform(size=80)``), 2 workers, batch 64, SGD, and after each epoch measures the accuracy on the
held-out set (``EvalTransform``, center crop 80 px). ``ours`` is ``loader.DataLoader`` with
``cache_bytes="auto"`` for both loaders (the form chosen by measurement). It prints one JSON line per epoch:
seconds (training and evaluation), accuracy, and the form each cache holds; it stops at TARGET. SEED seeds
the model's initial weights and the order of the samples.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import loader

CLASSES, TRAIN, HELD = 10, 1500, 300
PALETTE = np.array(  # a colour per class, far apart
    [[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48],
     [145, 30, 180], [70, 240, 240], [240, 50, 230], [128, 128, 0], [0, 0, 128]], np.float32
)  # fmt: skip
CROP = loader.TrainTransform(size=80)  # a random resized crop to 80 px, flipped half the time
EVAL = loader.EvalTransform(resize=88, size=80)


def make(root: Path) -> None:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500].astype(np.float32)
    for part, count in (("train", TRAIN), ("held", HELD)):
        for i in range(count):
            k = i % CLASSES
            angle = np.pi * k / CLASSES + rng.normal(0, 0.03)
            period = 6.0 * rng.uniform(0.9, 1.1)
            stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) / period)
            tint = (PALETTE[k] - 128.0) * 0.5 + rng.normal(0, 8, 3)
            pixels = 128 + 50 * stripes[..., None] + tint + rng.normal(0, 25, (375, 500, 3))
            folder = root / part / f"class_{k}"
            folder.mkdir(parents=True, exist_ok=True)
            image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
            image.save(folder / f"{i:05d}.jpg", quality=90)


def loaders(kind: str, root: Path, cache_dir: str, seed: int) -> tuple[torch.utils.data.DataLoader, ...]:
    train = loader.ImageFolder(root / "train", transform=CROP)
    held = loader.ImageFolder(root / "held", transform=EVAL)
    common = dict(batch_size=64, num_workers=2, persistent_workers=True)
    generator = torch.Generator().manual_seed(seed)
    if kind == "torch":
        make_loader = torch.utils.data.DataLoader
    else:

        def make_loader(dataset, **kw):
            return loader.DataLoader(dataset, cache_bytes="auto", cache_dir=cache_dir, **kw)

    return make_loader(train, shuffle=True, generator=generator, **common), make_loader(held, **common)


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 5, stride=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(512, CLASSES),
    )


def accuracy(net: torch.nn.Module, held: torch.utils.data.DataLoader) -> float:
    right = seen = 0
    with torch.no_grad():
        for images, labels in held:
            right += int((net(images.float() / 255).argmax(1) == labels).sum())
            seen += len(labels)
    return right / seen


def form(dl: torch.utils.data.DataLoader) -> str:
    return dl.stats().cache_form if isinstance(dl, loader.DataLoader) else "page cache"


def main(kind: str, root: str, cache_dir: str, target: str, max_epochs: str, seed: str) -> None:
    torch.manual_seed(int(seed))
    torch.set_num_threads(1)
    train, held = loaders(kind, Path(root), cache_dir, int(seed))
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for epoch in range(1, int(max_epochs) + 1):
        start = time.perf_counter()
        for images, labels in train:
            loss = torch.nn.functional.cross_entropy(net(images.float() / 255), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        score = accuracy(net, held)
        line = {"loader": kind, "epoch": epoch, "seconds": time.perf_counter() - start, "accuracy": score}
        print(json.dumps({**line, "forms": [form(train), form(held)]}), flush=True)
        if score >= float(target):
            return


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    else:
        main(*sys.argv[1:])
