"""A job with no data stall, for the bootstrap's overhead: in-memory samples, a fixed CPU step.

Prints ``steps_per_s <float>`` over its steady epochs (2 and later). Run plainly, and under the bootstrap.
"""

from __future__ import annotations

import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

STEPS, EPOCHS = 200, 4


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(STEPS * 16, 64), torch.zeros(STEPS * 16, dtype=torch.long))
    weight = torch.randn(64, 256)
    seconds, steps = 0.0, 0
    for epoch in range(EPOCHS):
        start = time.perf_counter()
        for x, _ in DataLoader(data, batch_size=16, shuffle=True):
            for _ in range(200):  # the step: ~2 ms of matmuls
                (x @ weight).relu_().sum()
            steps += epoch > 0
        seconds += (time.perf_counter() - start) * (epoch > 0)
    print(f"steps_per_s {steps / seconds:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
