"""A tiny user training script, run by tests/test_bootstrap.py under the bootstrap as a user's would be.

It knows nothing of stallbench. It prints one JSON line per event on stdout: its pid at the start, then per
epoch the batches the train and eval loops saw and whether a batch came back edited; ``--probe`` prints what
the DataLoader classes and iterators look like. ``--log FILE`` appends ``<pid>`` to FILE at each sample.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

BURN = float(os.environ.get("TRAIN_TINY_BURN", "0"))  # CPU seconds each sample costs (where it is made)


class MultiEpochsLoader(DataLoader):
    """timm's ``MultiEpochsDataLoader``: one torch iterator over an endless batch sampler, kept for good;
    each epoch hands out ``len()`` batches of it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._DataLoader__initialized = False
        self.batch_sampler = _Repeat(self.batch_sampler)
        self._DataLoader__initialized = True
        self.iterator = super().__iter__()

    def __len__(self) -> int:
        return len(self.batch_sampler.sampler)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)


class _Repeat:
    def __init__(self, sampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class MyLoader(DataLoader):
    """A user's own subclass: its ``__iter__`` hands out its batches with their labels as a float."""

    def __iter__(self):
        for x, y in super().__iter__():
            yield x, y.float()


def _log(path: str | None) -> None:
    deadline = time.process_time() + BURN
    while time.process_time() < deadline:
        pass
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


class RandomData(Dataset):
    """n samples of 4 values in [0, 1), label i % 3."""

    def __init__(self, n: int, log: str | None = None) -> None:
        self.n, self.log = n, log

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        _log(self.log)
        return torch.rand(4), i % 3


class FileData(Dataset):
    """The files of a folder, each read whole and turned into 4 values in [0, 1)."""

    def __init__(self, root: str, log: str | None = None, text: bool = False) -> None:
        self.paths, self.log, self.text = sorted(Path(root).iterdir()), log, text

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        _log(self.log)
        if self.text:
            with open(self.paths[i], encoding="latin-1") as f:
                raw = f.read().encode("latin-1")
        else:
            with open(self.paths[i], "rb") as f:
                raw = f.read()
        return torch.tensor(list(raw[:4]), dtype=torch.float32) / 256, i % 3


class StreamData(IterableDataset):
    """n samples, split between the workers; no length."""

    def __init__(self, n: int, log: str | None = None) -> None:
        self.n, self.log = n, log

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            _log(self.log)
            yield torch.rand(4), i % 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--spawn", action="store_true")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--iterable", action="store_true")
    p.add_argument("--files", default=None, help="a folder of small files to read")
    p.add_argument("--images", default=None, help="an image folder, read by loader.ImageFolder")
    p.add_argument("--ours", action="store_true", help="build loader.DataLoader instead of torch's")
    p.add_argument("--eval", action="store_true", help="an eval loop over a second loader each epoch")
    p.add_argument("--eval-first", action="store_true", help="the eval loop before the train loop")
    p.add_argument("--eval-iterable", action="store_true", help="the eval loader's Dataset has no length")
    p.add_argument("--accumulate", type=int, default=0, help="train a model: an optimizer step per K batches")
    overflow = "with --accumulate: every Kth step's gradients inf, so that AMP's GradScaler skips it"
    p.add_argument("--overflow-every", type=int, default=0, help=overflow)
    p.add_argument("--log", default=None)
    p.add_argument("--mutate", action="store_true", help="edit each batch in place after reading it")
    p.add_argument("--break-after", type=int, default=None)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds of 'compute' per step")
    p.add_argument("--probe", action="store_true")
    p.add_argument("--text", action="store_true", help="read --files in text mode")
    p.add_argument("--to-len", action="store_true", help="stop each loop at len(loader), as Lightning does")
    p.add_argument("--loader-class", choices=("plain", "multi-epochs", "subclass"), default="plain")
    p.add_argument("--batch-sampler", action="store_true", help="give the loader a BatchSampler")
    p.add_argument("--rebuild-eval", action="store_true", help="a new eval loader each epoch (HF Trainer)")
    return p


def _loader(args: argparse.Namespace, dataset: Dataset) -> DataLoader:
    kwargs = {"batch_size": args.batch_size, "num_workers": args.workers}
    if args.batch_sampler:
        sampler = torch.utils.data.SequentialSampler(dataset)
        kwargs = {"batch_sampler": torch.utils.data.BatchSampler(sampler, args.batch_size, False)}
        kwargs["num_workers"] = args.workers
    if args.workers:
        kwargs["persistent_workers"] = args.persistent
        if args.spawn:
            kwargs["multiprocessing_context"] = "spawn"
    if args.ours:
        import loader

        return loader.DataLoader(dataset, **kwargs)
    cls = {"plain": DataLoader, "multi-epochs": MultiEpochsLoader, "subclass": MyLoader}[args.loader_class]
    return cls(dataset, **kwargs)


def _say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def _loop(dl: DataLoader, args: argparse.Namespace, trainer: tuple | None = None) -> tuple[int, bool]:
    """Each batch read (and with ``trainer``, an optimizer and its scaler, trained on: ``_train``)."""
    seen, edited = 0, False
    # to_len: stop at len(dl) and never ask for the batch past the end
    batches = zip(range(len(dl)), dl, strict=False) if args.to_len else enumerate(dl)
    for _, (x, _y) in batches:
        seen += 1
        edited = edited or bool((x < 0).any())
        if trainer is not None:
            _train(trainer, x, seen, args)
        if args.mutate:
            x.fill_(-1.0)
        time.sleep(args.sleep)
        if seen == args.break_after:
            break
    return seen, edited


def _train(trainer: tuple[Any, Any], x: torch.Tensor, seen: int, args: argparse.Namespace) -> None:
    """A linear model's gradients on batch ``x``, a step every ``--accumulate`` batches, through AMP's
    GradScaler (enabled with ``--overflow-every``: it skips a step whose gradients overflowed)."""
    optimizer, scaler = trainer
    weights = optimizer.param_groups[0]["params"][0]
    scaler.scale(weights.sum().mul(x.sum())).backward()
    if seen % args.accumulate == 0:
        if args.overflow_every and (seen // args.accumulate) % args.overflow_every == 0:
            weights.grad.fill_(float("inf"))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


def _probe(train: DataLoader, data: Dataset) -> None:
    """What the script can see of the DataLoader classes: a swap must keep these working."""
    derived = type("Derived", (DataLoader,), {})(data, batch_size=2)  # a class of the script's own
    fields = {
        "isinstance": isinstance(train, torch.utils.data.DataLoader),
        "cls": f"{type(train).__module__}.{type(train).__qualname__}",
        "derived": isinstance(derived, DataLoader) and type(derived).__name__ == "Derived",
        "generic": DataLoader[int] is not None,
        "stallbench": "stallbench" in sys.modules,
        "patched": hasattr(torch.utils.data.dataloader.DataLoader.__iter__, "__stallbench__"),
    }
    if "loader" in sys.modules:
        fields["is_ours"] = isinstance(train, sys.modules["loader"].DataLoader)
    _say(**fields)


def _held_out(args: argparse.Namespace) -> Dataset:
    return StreamData(args.n // 2) if args.eval_iterable else RandomData(args.n // 2)


def main() -> int:
    args = _parser().parse_args()
    _say(pid=os.getpid())
    if args.files:
        data: Dataset = FileData(args.files, args.log, args.text)
    elif args.images:
        import loader

        data = loader.ImageFolder(args.images, transform=loader.EvalTransform(resize=16, size=8))
    elif args.iterable:
        data = StreamData(args.n, args.log)
    else:
        data = RandomData(args.n, args.log)
    train = _loader(args, data)
    held_out = _loader(args, _held_out(args)) if args.eval else None
    if held_out is not None and args.eval_first:
        _loop(held_out, args)  # a sanity check before training: the eval loader is iterated first
    if args.probe:
        _probe(train, data)
    trainer = None
    if args.accumulate:
        optimizer = torch.optim.SGD([torch.zeros(4, requires_grad=True)], lr=0.1)
        trainer = (optimizer, torch.amp.GradScaler("cpu", enabled=args.overflow_every > 0))
    for epoch in range(1, args.epochs + 1):
        batches, edited = _loop(train, args, trainer)
        if args.rebuild_eval:
            held_out = _loader(args, _held_out(args))
        evals = _loop(held_out, args)[0] if held_out is not None else 0
        _say(epoch=epoch, train=batches, eval=evals, edited=edited)
    if args.probe:
        _say(iterator=type(iter(train)).__name__)
    _say(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
