"""The prep-bound case with a real model's step on the GPU: how much of the epoch the GPU works, per loader.

Where a GPU is lent: ``bench_prep_bound``'s 1,200 JPEGs of 500x375, ``transform="train"``, batch 64, 2
persistent workers (few cores per GPU), warm data, and for each batch a ResNet-18 step on the GPU (forward
and backward in bfloat16 autocast, SGD; ``_prep_job.py gpu``). torch's loader against ours holding the
records prepared, each job in its own process, alternating, 2 rounds of 2 timed epochs. Reported: images/s
and the GPU's busy share of each epoch (CUDA events around each step's work); target: ours' images/s and
busy share at least torch's (the step cannot make our loader slower).

    python -m pytest benchmarks/bench_gpu_step.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stallbench.jobs.run import scratch_cache_dir
from stallbench.report import plain_table
from stallbench.workloads import make_jpeg_folder

SCRIPT = Path(__file__).with_name("_prep_job.py")
REPO = Path(__file__).resolve().parents[1]
NUM_IMAGES, EPOCHS, ROUNDS = 1200, 2, 2
KINDS = ("torch", "prepared")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def job(kind: str, data: Path, cache_dir: Path) -> list[dict]:
    argv = [sys.executable, str(SCRIPT), kind, str(data), str(EPOCHS), str(cache_dir), "gpu", "train"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    if done.returncode != 0:
        pytest.fail(f"the {kind} job exited {done.returncode}:\n{done.stderr[-2000:]}", pytrace=False)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.benchmark(group="gpu-step")
def test_gpu_busy_share(benchmark, bench_data_root: Path) -> None:
    data = make_jpeg_folder(bench_data_root / f"prep-{NUM_IMAGES}", num_images=NUM_IMAGES)
    epochs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    cache_dir = scratch_cache_dir()

    def one_round() -> None:
        order = KINDS if len(epochs["torch"]) % (2 * EPOCHS) == 0 else KINDS[::-1]
        for kind in order:
            epochs[kind] += job(kind, data, cache_dir)

    try:
        benchmark.pedantic(one_round, rounds=ROUNDS)
        while len(epochs["torch"]) < ROUNDS * EPOCHS:  # benchmarks disabled: pedantic ran one round
            one_round()
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    rate = {k: statistics.median(e["images_per_s"] for e in epochs[k]) for k in KINDS}
    busy = {k: statistics.median(e["gpu_busy_share"] for e in epochs[k]) for k in KINDS}
    rows = [[k, len(epochs[k]), epochs[k][-1]["form"], f"{rate[k]:.0f}", f"{busy[k]:.1%}",
             ", ".join(f"{e['gpu_busy_share']:.1%}" for e in epochs[k])] for k in KINDS]  # fmt: skip
    print(f"\nResNet-18 on {torch.cuda.get_device_name()}, 2 workers, medians over {ROUNDS} rounds")
    print(plain_table(["loader", "epochs", "cache holds", "images/s", "GPU busy", "per epoch"], rows))
    print(f"prepared / torch images/s = {rate['prepared'] / rate['torch']:.2f}")
    benchmark.extra_info.update(images_per_s=rate, gpu_busy_share=busy)
    assert rate["prepared"] >= rate["torch"] and busy["prepared"] >= busy["torch"], (rate, busy)
