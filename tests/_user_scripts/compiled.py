"""A loop over a ``torch.compile``d model (backend ``aot_eager``: compiled in about a second, no C compiler),
run by tests/test_transitions.py under the bootstrap. Its batches change shape in one step of epoch 2, which
recompiles. It knows nothing of stallbench: it prints its pid, then per epoch each step's time, its witness
(a compiling step's excess over the epoch's median step is its compilation)."""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
print(json.dumps({"pid": os.getpid()}), flush=True)
data = DataLoader(TensorDataset(torch.randn(96, 16)), batch_size=8)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model = torch.compile(net, backend="aot_eager")
optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
for epoch in range(3):
    steps = []
    for step, (x,) in enumerate(data):
        start = time.perf_counter()
        if epoch == 1 and step == 5:
            x = torch.cat([x, x[:3]])  # another batch size: torch.compile compiles again
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter() - start)
    typical = statistics.median(steps)
    print(json.dumps({"epoch": epoch + 1, "excess": sum(s - typical for s in steps if s > 3 * typical)}))
