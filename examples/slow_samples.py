"""A training loop whose data has a few slow samples: 1 in 100 takes 50x the others to prepare (a huge image
in a folder of small ones, a slow read). The step is a sleep, as a GPU's leaves the cores to the workers,
and the loader just keeps up on average, so the slow samples are what the loop waits for.

    python examples/slow_samples.py                  # torch's DataLoader
    python examples/slow_samples.py --ready-first    # ours, batches of the samples ready first
"""

from __future__ import annotations

import argparse
import time

import torch

SLOW_EVERY, SLOW_TIMES = 100, 50


def spin(seconds: float) -> None:
    """Busy for ``seconds``, as a decode is."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class FewSlow(torch.utils.data.Dataset):
    """``n`` samples of ``prep`` seconds each, every ``SLOW_EVERY``-th ``SLOW_TIMES`` as long."""

    def __init__(self, n: int, prep: float) -> None:
        self.n, self.prep = n, prep

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        spin(self.prep * (SLOW_TIMES if i % SLOW_EVERY == 0 else 1))
        return {"x": torch.full((16,), float(i)), "index": i}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1600)
    parser.add_argument("--prep-ms", type=float, default=0.5, help="per sample; the slow ones 50x")
    parser.add_argument("--step-ms", type=float, default=10.0, help="per batch of 32")
    parser.add_argument("--ready-first", action="store_true", help="loader.DataLoader(ready_first=True)")
    args = parser.parse_args()
    data = FewSlow(args.samples, args.prep_ms / 1000)
    options = {"batch_size": 32, "shuffle": True, "num_workers": 2}
    if args.ready_first:
        import loader

        train = loader.DataLoader(data, ready_first=True, **options)
    else:
        train = torch.utils.data.DataLoader(data, **options)
    for epoch in range(args.epochs):
        start, seen = time.perf_counter(), 0
        for batch in train:
            seen += len(batch["index"])
            time.sleep(args.step_ms / 1000)  # the step
        print(f"epoch {epoch}: {seen} samples in {time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main()
