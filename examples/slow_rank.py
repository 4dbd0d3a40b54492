"""Two or more ranks on gloo averaging their gradients by hand (an all-reduce per parameter, every step), one
rank's samples slower to prepare: the others wait at each step's all-reduce for its data. Writes, per rank
and epoch, to ``OUT/witness-<rank>.jsonl`` the seconds it spent in ``next()`` and in the all-reduces, timed
by hand: the witness of stallbench's slow-rank figures. Run under torchrun."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist


class Prepared(torch.utils.data.Dataset):
    """Samples that take ``delay`` seconds each to prepare (a sleep: the wait of a slow disk or decode)."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.delay)
        return torch.full((8,), float(i % 7)), i % 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--slow-ms", type=float, default=6.0, help="per sample, on the slow rank")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    delay = (args.slow_ms if rank == args.slow_rank else 0.5) / 1000
    loader = torch.utils.data.DataLoader(Prepared(64, delay), batch_size=4)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(1, args.epochs + 1):
        waited = reduced = 0.0
        batches = iter(loader)
        while True:
            start = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            waited += time.perf_counter() - start
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            start = time.perf_counter()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            reduced += time.perf_counter() - start
            optimizer.step()
        with open(args.out / f"witness-{rank}.jsonl", "a") as f:
            f.write(json.dumps({"rank": rank, "epoch": epoch, "wait": waited, "collective": reduced}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
