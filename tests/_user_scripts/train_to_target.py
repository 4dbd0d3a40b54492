"""A user's training script that measures its time to a quality target with ``stallbench.time_to_target``.

A linear model learns the sum of 8 byte values taken from the middle of each file of ``--data``; the held-out
loss is the mean squared error on 64 fixed random inputs. It prints the result's summary at the end.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

import stallbench


class MiddleBytes(Dataset):
    """Each file's 8 bytes from its middle, scaled to [0, 1), and their sum as the target."""

    def __init__(self, root: str) -> None:
        self.paths = sorted(p for p in Path(root).rglob("*") if p.is_file() and not p.name.startswith("."))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        raw = self.paths[i].read_bytes()
        middle = len(raw) // 2
        x = torch.tensor(list(raw[middle : middle + 8]), dtype=torch.float32) / 256
        return x, x.sum(dim=0, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--target", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(MiddleBytes(args.data), batch_size=16, shuffle=True, num_workers=1)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    held_out = torch.rand(64, 8)

    def train_epoch() -> int:
        updates = 0
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1
        return updates

    def evaluate() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(held_out), held_out.sum(1, keepdim=True)))

    result = stallbench.time_to_target(train_epoch, evaluate, args.target, max_epochs=args.epochs)
    print(result.summary(), flush=True)


if __name__ == "__main__":
    main()
