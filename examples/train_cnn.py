"""Train a small CNN on an image folder: the plain PyTorch script a user writes, with nothing of stallbench.

    python examples/train_cnn.py --data DIR                           # one process
    torchrun --standalone --nproc_per_node 2 examples/train_cnn.py --data DIR   # DDP, one line per epoch

``DIR`` is in the ImageNet layout, ``DIR/<class>/<file>.jpg``. It is kept free of stallbench and ``loader`` on
purpose: ``stallbench analyze --data DIR -- python examples/train_cnn.py --data DIR`` measures a script that
was never changed for it, which is the case the tool exists for. ``--slow-ms`` makes each sample's
preparation slower, so tests can produce a data-bound run on a tiny dataset.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

__all__ = ["ImageFolderDataset", "SmallCNN", "main", "parse_args"]

_EXTENSIONS = (".jpg", ".jpeg", ".png")
_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # the usual ImageNet channel statistics
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def _number(
    kind: type, low: float, high: float = float("inf"), open_low: bool = False
) -> Callable[[str], int | float]:
    """An argparse ``type`` that converts and range-checks, so a bad value is named before any work starts."""

    def convert(text: str) -> int | float:
        value = kind(text)
        if not (low < value if open_low else low <= value) or not value < high:
            raise argparse.ArgumentTypeError(f"{text} is out of range")
        return value

    return convert


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a small CNN on an ImageNet-layout image folder.")
    p.add_argument("--data", required=True, type=Path, help="root/<class>/<file>.jpg")
    p.add_argument("--epochs", type=_number(int, 1), default=3)
    p.add_argument("--batch-size", type=_number(int, 1), default=64)
    p.add_argument("--workers", type=_number(int, 0), default=2, help="DataLoader worker processes")
    p.add_argument("--lr", type=_number(float, 0, open_low=True), default=0.02)
    p.add_argument("--image-size", type=_number(int, 4), default=32, help="resize to this square (min 4)")
    p.add_argument("--slow-ms", type=_number(float, 0), default=0.0, help="extra sleep per sample")
    p.add_argument("--eval-fraction", type=_number(float, 0, 1), default=0.1, help="share held out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    return p.parse_args(argv)


def list_images(root: Path) -> tuple[list[tuple[Path, int]], list[str]]:
    """(path, label) of every image, labels from the sorted class folder names."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    samples = [
        (path, label)
        for label, name in enumerate(classes)
        for path in sorted((root / name).iterdir())
        if path.suffix.lower() in _EXTENSIONS
    ]
    if not samples:
        raise SystemExit(f"no images under {root} (expected {root}/<class>/<file>.jpg)")
    return samples, classes


class ImageFolderDataset(Dataset):
    """Decode, resize, flip (training only) and normalise one image per ``__getitem__``."""

    def __init__(self, samples: list[tuple[Path, int]], size: int, train: bool, slow_ms: float = 0.0) -> None:
        self.samples, self.size, self.train, self.slow_s = samples, size, train, slow_ms / 1e3
        self._gen: torch.Generator | None = None
        self._gen_pid = -1

    def __len__(self) -> int:
        return len(self.samples)

    def _generator(self) -> torch.Generator:
        # Made lazily in each process: torch seeds every worker differently (initial_seed), so workers
        # flip different images, and a re-forked worker in the next epoch flips anew.
        if self._gen_pid != os.getpid():
            self._gen = torch.Generator().manual_seed(torch.initial_seed())
            self._gen_pid = os.getpid()
        return self._gen

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with Image.open(path) as img:
            pixels = np.asarray(img.convert("RGB").resize((self.size, self.size), Image.Resampling.BILINEAR))
        if self.train and torch.rand(1, generator=self._generator()).item() < 0.5:
            pixels = pixels[:, ::-1]
        if self.slow_s:
            time.sleep(self.slow_s)
        x = (pixels.astype(np.float32) / 255.0 - _MEAN) / _STD
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), label


class SmallCNN(nn.Module):
    """Three conv layers: small enough that a CPU step is short and the data side shows."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU())

        self.features = nn.Sequential(
            block(3, 16), nn.MaxPool2d(2), block(16, 32), nn.MaxPool2d(2), block(32, 64)
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def setup(args: argparse.Namespace) -> tuple[torch.device, int, int]:
    """The device, rank and world size; starts torch.distributed when torchrun launched several processes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    name = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank if world > 1 else 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device, rank, world


def split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train and held-out indices: the same split in every process, since all use the same seed."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    held = min(n - 1, max(1, round(n * fraction))) if fraction > 0 else 0
    return order[held:], order[:held]


def make_loaders(
    args: argparse.Namespace, rank: int, world: int, pin: bool
) -> tuple[DataLoader, DataLoader, DistributedSampler | None, int]:
    """Train loader (sharded by DistributedSampler under DDP), eval loader over this rank's share, classes."""
    samples, classes = list_images(args.data)
    train_idx, eval_idx = split(len(samples), args.eval_fraction, args.seed)
    train = ImageFolderDataset([samples[i] for i in train_idx], args.image_size, True, args.slow_ms)
    held = ImageFolderDataset([samples[i] for i in eval_idx[rank::world]], args.image_size, False)
    sampler = DistributedSampler(train, world, rank, seed=args.seed) if world > 1 else None
    common = {"batch_size": args.batch_size, "num_workers": args.workers, "pin_memory": pin}
    train_loader = DataLoader(
        train,
        shuffle=sampler is None,
        sampler=sampler,
        generator=torch.Generator().manual_seed(args.seed),
        **common,
    )
    return train_loader, DataLoader(held, shuffle=False, **common), sampler, len(classes)


def train_epoch(
    model: nn.Module, loader: DataLoader, opt: torch.optim.Optimizer, device: torch.device
) -> tuple[float, int]:
    """Summed loss and number of batches of one pass over ``loader``."""
    model.train()
    total, batches = 0.0, 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total, batches = total + loss.item(), batches + 1
    return total, batches


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[int, int]:
    model.eval()
    correct = seen = 0
    for x, y in loader:
        pred = model(x.to(device, non_blocking=True)).argmax(dim=1).cpu()
        correct, seen = correct + int((pred == y).sum()), seen + len(y)
    return correct, seen


def _all_sum(values: list[float], world: int) -> list[float]:
    """Sums over all processes (each holds its own shard's figures); as is with one process."""
    if world == 1:
        return values
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def report_epoch(epoch: int, train: tuple[float, int], held: tuple[int, int], rank: int, world: int) -> None:
    """Rank 0 prints the epoch's line, with loss and accuracy summed over every process's share."""
    loss_sum, n, correct, seen = _all_sum([*train, *held], world)
    acc = f"{correct / seen:.2f}" if seen else "n/a"
    if rank == 0:
        line = f"epoch {epoch + 1}: train loss {loss_sum / max(n, 1):.2f}, eval accuracy {acc}"
        print(f"{line}, {train[1]} batches", flush=True)


def run(args: argparse.Namespace, device: torch.device, rank: int, world: int) -> None:
    """Train and evaluate for ``args.epochs`` epochs, printing a line per epoch on rank 0."""
    train_loader, eval_loader, sampler, classes = make_loaders(args, rank, world, device.type == "cuda")
    model = net = SmallCNN(classes).to(device)
    if world > 1:
        net = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        train = train_epoch(net, train_loader, opt, device)
        report_epoch(epoch, train, evaluate(model, eval_loader, device), rank, world)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device, rank, world = setup(args)
    try:
        run(args, device, rank, world)
    except BaseException:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()  # no barrier: the other ranks may be inside a collective
        raise
    if world > 1:
        # DDP holds the process group through reference cycles: collect them now, not while the interpreter
        # shuts down (gloo then aborted a rank: SIGABRT, "terminate called without an active exception"),
        # and let every rank pass its last collective before any tears down
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
