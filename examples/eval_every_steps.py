"""A training loop with transitions: every ``--every`` steps an evaluation pass over its own DataLoader and a
checkpoint (``torch.save``, or safetensors' ``save_file`` taken by name at import, as the Hugging Face
Trainer takes it), and one of each between epochs. It knows nothing of stallbench: it times each by hand,
and prints its pid, then per epoch one JSON line of those witness times ([seconds, count] per kind): inside
the epoch's loop and after it (docs/how-to/analyze-your-job.md; tests/test_transitions.py holds
stallbench's figures against them).

``--eval-to-len``: the evaluation loop stops at ``len()`` without asking for the batch past the end
(Lightning's), so its loader's epoch ends only when training asks for its next batch.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    """``n`` samples of 16 floats, each taking ``seconds`` to make."""

    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.full((16,), float(i))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--eval-to-len", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    train = DataLoader(Slow(96, 0.0005), batch_size=8, shuffle=True)
    evaluation = DataLoader(Slow(24, 0.002), batch_size=8)
    state = {"weights": torch.randn(1 << 20)}  # 4 MB a checkpoint
    print(json.dumps({"pid": os.getpid()}), flush=True)

    def evaluate() -> float:
        start = time.perf_counter()
        if args.eval_to_len:
            for _, batch in zip(range(len(evaluation)), evaluation, strict=False):
                batch.sum()
        else:
            for batch in evaluation:
                batch.sum()
        return time.perf_counter() - start

    def checkpoint(step: int) -> float:
        start = time.perf_counter()
        if step % 2:
            save_file(state, f"{args.out}/model.safetensors")
        else:
            torch.save(state, f"{args.out}/model.pt")
        return time.perf_counter() - start

    for epoch in range(3):
        seen = {"evaluation": [0.0, 0], "checkpoint": [0.0, 0]}
        for step, batch in enumerate(train, 1):
            time.sleep(0.005)  # the step
            batch.sum()
            if step % args.every == 0:
                seen["evaluation"][0] += evaluate()
                seen["checkpoint"][0] += checkpoint(step // args.every)
                seen["evaluation"][1] += 1
                seen["checkpoint"][1] += 1
        between = {"evaluation": [evaluate(), 1], "checkpoint": [checkpoint(epoch), 1]}
        print(json.dumps({"epoch": epoch + 1, "inside": seen, "between": between}), flush=True)


if __name__ == "__main__":
    main()
