"""Tar shards against the same records as files: a shuffled epoch reads no slower from the shards.

1,200 JPEGs of 500x375 (~66 kB), written as WebDataset tar shards of 16 MB (``image_folder_to_tar_shards``).
torch's DataLoader, 2 persistent workers, batch 64, shuffled, over ``loader.ImageFolder`` and
``loader.TarShards`` with ``transform=None`` (the records' bytes: the read path alone, not the decode), 3
epochs per case, the page cache of both evicted before each epoch (cold) or left full (warm). Each round runs
every case once, files and shards in turn; records per second, medians over the rounds:

- shards / files >= 0.95, cold and warm.

    python -m pytest benchmarks/bench_tar_shards.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
import torch.utils.data

from loader import ImageFolder, TarShards
from loader.sources import image_folder_to_tar_shards
from stallbench.conditions.storage import evict_page_cache
from stallbench.report import plain_table
from stallbench.workloads import make_jpeg_folder

NUM_IMAGES, ROUNDS, EPOCHS, LEAST = 1200, 9, 3, 0.95


@pytest.fixture(scope="module")
def data(bench_data_root: Path) -> tuple[Path, Path]:
    images = make_jpeg_folder(bench_data_root / f"prep-{NUM_IMAGES}", num_images=NUM_IMAGES)
    shards = bench_data_root / f"shards-{NUM_IMAGES}"
    if not shards.exists():
        image_folder_to_tar_shards(images, shards, shard_bytes=16 << 20)
    return images, shards


def loader(dataset) -> torch.utils.data.DataLoader:
    """Workers started once (persistent): an epoch times the reads, not the workers' start."""
    dl = torch.utils.data.DataLoader(
        dataset, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True, collate_fn=list
    )
    sum(len(batch) for batch in dl)  # warm-up epoch, untimed
    return dl


def records_per_s(dl: torch.utils.data.DataLoader, cold: bool, where: Path) -> float:
    """Over EPOCHS epochs, the page cache evicted before each one when ``cold`` (the eviction untimed)."""
    seconds, records = 0.0, 0
    for _ in range(EPOCHS):
        if cold:
            evict_page_cache(where)
        start = time.perf_counter()
        records += sum(len(batch) for batch in dl)
        seconds += time.perf_counter() - start
    return records / seconds


@pytest.mark.benchmark(group="tar-shards")
def test_tar_shards_read_as_fast_as_files(benchmark, data) -> None:
    images, shards = data
    kinds = {"files": (loader(ImageFolder(images, transform=None)), images)}
    kinds["shards"] = (loader(TarShards(shards, transform=None)), shards)
    rates = {(kind, cold): [] for kind in kinds for cold in (True, False)}

    def one_round() -> None:
        order = list(kinds) if len(rates[("files", True)]) % 2 == 0 else list(reversed(kinds))
        for cold in (True, False):
            for kind in order:
                dl, where = kinds[kind]
                rates[(kind, cold)].append(records_per_s(dl, cold, where))

    benchmark.pedantic(one_round, rounds=ROUNDS)
    while len(rates[("files", True)]) < ROUNDS:  # benchmarks disabled: pedantic ran one round
        one_round()
    median = {key: statistics.median(values) for key, values in rates.items()}
    rows = [[kind, "cold" if cold else "warm", f"{rate:,.0f}"] for (kind, cold), rate in median.items()]
    print(f"\ntar shards against files: median records/s over {ROUNDS} rounds")
    print(plain_table(["records", "page cache", "records/s"], rows))
    ratios = {cold: median[("shards", cold)] / median[("files", cold)] for cold in (True, False)}
    for cold, ratio in ratios.items():
        print(f"shards / files, {'cold' if cold else 'warm'}: {ratio:.2f}")
    benchmark.extra_info["ratios"] = {"cold" if c else "warm": r for c, r in ratios.items()}
    assert min(ratios.values()) >= LEAST, f"shards / files below {LEAST}: {ratios}"
