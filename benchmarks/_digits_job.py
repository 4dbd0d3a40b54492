"""The tight-budget job of bench_tight_budget.py: a user's own Dataset of small digit JPEGs, a CNN to 95%.

``_digits_job.py make ROOT`` writes the data once: digits 0-9 drawn with PIL's font at random places and
angles under noise, 64x64 JPEGs of ~3.8 KB, 11,520 in ``ROOT/train`` and 1,000 in ``ROOT/test`` (issue 19's
job wrote scikit-learn's digits the same way; the project does not install scikit-learn).

``_digits_job.py torch|ours ROOT CACHE_DIR TARGET MAX_EPOCHS [EVAL_MIB]`` trains a small CNN (SGD, CPU, one
thread) on ``Digits``, a Dataset as users write it (``PIL.Image.open(path)`` per item), 2 persistent
workers, batch 64, shuffled, and measures the test accuracy after each epoch, holding EVAL_MIB MiB more of
its own memory while it does (0 by default; a bigger evaluation batch or a checkpoint's copy would). ``ours``
is ``loader.DataLoader`` with ``cache_bytes="auto"`` and ``cache_files=ROOT``, its cache in CACHE_DIR: the
one import and the one argument (CACHE_DIR ``none``: ours without a cache, the job's own memory with our
loader). It prints one JSON line per epoch (seconds, accuracy, the kernel's storage bytes for the job, the
training process's minor page faults, and for ours the bytes its cache holds) and stops at TARGET.

``_digits_job.py loop torch|ours ROOT CACHE_DIR WORKERS EPOCHS`` iterates the same training loader with
WORKERS workers and no step, and prints the epochs' seconds as one JSON line: what the loader alone costs.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

import loader
from loader.system.counters import storage_read_bytes

TRAIN, TEST, SIDE = 11_520, 1_000, 64


def make(root: Path) -> None:
    rng = np.random.default_rng(0)
    font = ImageFont.load_default(size=40)
    for part, count in (("train", TRAIN), ("test", TEST)):
        for i in range(count):
            digit = i % 10
            image = Image.new("L", (SIDE, SIDE), 0)
            where = (SIDE // 2 + int(rng.integers(-8, 9)), SIDE // 2 + int(rng.integers(-8, 9)))
            ImageDraw.Draw(image).text(where, str(digit), fill=255, font=font, anchor="mm")
            image = image.rotate(float(rng.uniform(-25, 25)), resample=Image.BILINEAR)
            pixels = np.asarray(image, np.float32) + rng.normal(0, 40, (SIDE, SIDE))
            folder = root / part / str(digit)
            folder.mkdir(parents=True, exist_ok=True)
            noisy = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert("RGB")
            noisy.save(folder / f"{i:05d}.jpg", quality=95)


class Digits(torch.utils.data.Dataset):
    """A folder of ``<digit>/<name>.jpg``, read as users write it: one ``Image.open`` per item."""

    def __init__(self, root: Path) -> None:
        self.files = sorted(root.glob("*/*.jpg"))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path = self.files[i]
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L"), np.float32) / 255
        return torch.from_numpy(pixels)[None], int(path.parent.name)


def loaders(
    kind: str, root: Path, cache_dir: str, workers: int = 2
) -> tuple[torch.utils.data.DataLoader, ...]:
    common = dict(batch_size=64, num_workers=workers, persistent_workers=workers > 0)
    if kind == "ours" and cache_dir != "none":
        common.update(cache_bytes="auto", cache_dir=cache_dir, cache_files=str(root))
    make_loader = loader.DataLoader if kind == "ours" else torch.utils.data.DataLoader
    generator = torch.Generator().manual_seed(0)
    train = make_loader(Digits(root / "train"), shuffle=True, generator=generator, **common)
    return train, make_loader(Digits(root / "test"), **common)


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 5, stride=2, padding=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 8 * 8, 10),
    )


def accuracy(net: torch.nn.Module, test: torch.utils.data.DataLoader, eval_mib: int = 0) -> float:
    right = seen = 0
    _held = np.ones(eval_mib << 20, np.uint8)  # held to the end, every page written: the job's own memory
    with torch.no_grad():
        for images, labels in test:
            right += int((net(images).argmax(1) == labels).sum())
            seen += len(labels)
    return right / seen


def cached_bytes(dl: torch.utils.data.DataLoader) -> int:
    return dl.stats().cache_bytes_used if isinstance(dl, loader.DataLoader) else 0


def minor_faults() -> int:
    """Pages the training process has faulted in so far (its workers not counted)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(kind: str, root: str, cache_dir: str, target: str, max_epochs: str, eval_mib: str = "0") -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train, test = loaders(kind, Path(root), cache_dir)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.005, momentum=0.9)
    for epoch in range(1, int(max_epochs) + 1):
        start, read, faults = time.perf_counter(), storage_read_bytes(), minor_faults()
        for images, labels in train:
            loss = torch.nn.functional.cross_entropy(net(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        score = accuracy(net, test, int(eval_mib))
        line = {"loader": kind, "epoch": epoch, "seconds": time.perf_counter() - start, "accuracy": score}
        line.update(storage_bytes=storage_read_bytes() - read, cached_bytes=cached_bytes(train))
        line.update(minor_faults=minor_faults() - faults)
        print(json.dumps(line), flush=True)
        if score >= float(target):
            return


def loop(kind: str, root: str, cache_dir: str, workers: str, epochs: str) -> None:
    torch.set_num_threads(1)
    train = loaders(kind, Path(root), cache_dir, int(workers))[0]
    seconds = []
    for _ in range(int(epochs)):
        start = time.perf_counter()
        for _batch in train:
            pass
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    elif sys.argv[1] == "loop":
        loop(*sys.argv[2:])
    else:
        main(*sys.argv[1:])
