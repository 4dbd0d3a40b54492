"""The loaders users pick instead of ours, on the same bucket behind the same link: LitData, MosaicML
Streaming and WebDataset beside torch's loader and ours.

The bucket of ``bench_object_store.py`` (3,000 JPEGs of 112 KB, 200 Mbit/s shaped by the kernel), 10 ms added
to each round trip by the proxy, which serves HTTPS here (LitData reads through obstore, which refuses plain
HTTP), as a load balancer in front of object storage does (``tests/delay_proxy.py`` says why not moto's own
TLS). Each
other loader reads its copy, converted with its own tool and put beside the data in the bucket
(``stallbench.jobs.object_copies``), built as ``stallbench compare`` builds it, at its default settings
(LitData and Streaming keep every chunk or shard they download on local disk: up to 100 GB for LitData,
without a limit for Streaming; WebDataset streams every shard every epoch); ours with a cache of half the
data in memory. 2 workers, batch 64, shuffled, 3 epochs, the fetch path alone (a collate that only counts).
Targets: ours within 10% of the fastest in epoch 1, and the fastest in every epoch after it.

    python -m pytest benchmarks/bench_object_store_peers.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _shaped_bucket import EPOCHS, MB, URL, count, epochs, latency, shaped_bucket

import loader
from stallbench.report import plain_table


@pytest.fixture(scope="module")
def bucket(bench_data_root: Path) -> Iterator[float]:
    """The images in the shaped server's bucket; the link's rate in bytes/s."""
    with shaped_bucket(bench_data_root) as rate:
        yield rate


PEERS_RTT_MS = 10


@pytest.mark.timeout(3600)
def test_the_loaders_users_pick_instead_on_the_same_bucket(benchmark, bucket: float, tmp_path: Path) -> None:
    """torch's loader, ours (a cache of half), LitData, Streaming and WebDataset (each on its copy in the
    bucket, written by its own tool, at its default settings), built as ``stallbench compare`` builds them."""
    from stallbench.jobs.kinds import KINDS
    from stallbench.jobs.others import convert
    from stallbench.jobs.spec import WorkloadJob

    kinds = ("torch", "cached", "litdata", "streaming", "webdataset")
    for kind in kinds:
        if KINDS[kind].converts:
            convert(URL, kind)  # untimed, as its users convert
    nbytes = loader.ImageFolder(URL, transform=None).source.nbytes
    cache_dir = tempfile.mkdtemp(prefix="sbbench-", dir="/dev/shm")

    def build(kind: str):
        ours = dict(cache_bytes=nbytes // 2, cache_dir=cache_dir) if KINDS[kind].cached else {}
        job = WorkloadJob(kind, URL, epochs=EPOCHS, workers=2, batch_size=64, transform="none", **ours)
        common = dict(num_workers=2, persistent_workers=True, generator=torch.Generator().manual_seed(0))
        dataset = loader.ImageFolder(URL, transform=None)
        return KINDS[kind].build(dataset, count, job, batch_size=64, shuffle=True, **common)

    def run() -> dict[str, list[tuple[float, int | None]]]:
        return {kind: epochs(build(kind), lambda: None) for kind in kinds}

    try:
        with latency(PEERS_RTT_MS, tmp_path):
            results = benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    limit = nbytes / bucket
    print(
        f"\nD {nbytes / MB:.0f} MB, link {bucket / MB:.1f} MB/s (HTTPS), its limit {limit:.2f} s,",
        f"{PEERS_RTT_MS} ms added to each round trip",
    )
    header = ["loader", *(f"epoch {i} s" for i in range(1, EPOCHS + 1)), "epoch 1 / limit"]
    rows = [[k, *(f"{s:.2f}" for s, _ in v), f"{v[0][0] / limit:.2f}"] for k, v in results.items()]
    print(plain_table(header, rows))
    ours = [s for s, _ in results["cached"]]
    for kind, times in results.items():
        print(
            f"{kind} / ours, epoch by epoch:",
            [round(s / o, 2) for (s, _), o in zip(times, ours, strict=True)],
        )
    benchmark.extra_info.update(results=results, link_bytes_per_s=bucket)
    fastest_first = min(v[0][0] for v in results.values())
    assert ours[0] <= 1.10 * fastest_first, f"epoch 1 {ours[0]:.2f} s against the fastest {fastest_first:.2f}"
    for kind, times in results.items():
        assert all(o <= s for o, (s, _) in zip(ours[1:], times[1:], strict=True)), (
            f"{kind} faster after epoch 1"
        )
