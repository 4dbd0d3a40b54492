"""What our loader costs as the dataset grows: 10,000, 100,000 and 1,000,000 records (issue 46, req. 6).

The records are small files (200-499 B of random bytes) in an ImageNet layout of 1,000 class folders, and
the same records in an LMDB (``image_folder_to_lmdb``). Every figure comes from a process of its own, as a
job's run starts (``_scale_job.py``), with the files' metadata and pages warm for every loader (this machine
keeps them; a cold start costs ours its stats and torch's loader its reads alike). Per size and format:

* **build** (listing, fingerprint) and **time to the first batch** (2 workers, batch 256, shuffled) of
  torch's DataLoader over the Dataset a user writes, of ours (``loader.ImageFolder``/``LMDBDataset``,
  ``cache_bytes="auto"``) and, for files, of the user's Dataset under ours with ``cache_files=``; each run
  twice on a fresh cache folder: a job's first run, then its second (our listing kept, our store attached);
* **index and store bytes per record**: the cache's index per record of the dataset, and what the store
  holds per record it holds against the records' own bytes;
* **CPU per record on the hit path**: a second pass over 20,000 random records (the first read them: into
  our cache, or into the page cache for torch's), batch 64, no workers.

Targets: every cost linear or better (per record, 1M within 1.5x of 100k: fixed costs weigh on 10k);
index bytes per record <= 100; first batch at 1M within 2x of torch's; building an unchanged 1M folder a
second time <= 1 s.

    python -m pytest benchmarks/bench_scale.py -p no:cacheprovider --benchmark-enable -s
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loader.sources import image_folder_to_lmdb
from stallbench.report import plain_table

SIZES = (10_000, 100_000, 1_000_000)
CLASSES = 1_000
JOB = Path(__file__).with_name("_scale_job.py")
LOADERS = {"files": ("torch", "ours", "ours-files"), "lmdb": ("torch", "ours")}
LINEAR = 1.5  # per-record cost at 1M over that at 100k
MAX_INDEX_BYTES = 100
FIRST_BATCH = 2.0  # ours / torch's at 1M
RELIST_SECONDS = 1.0


@pytest.fixture(scope="module")
def data(bench_data_root: Path) -> dict[tuple[str, int], Path]:
    made = {}
    for n in SIZES:
        files = _small_files(bench_data_root / f"scale-files-{n}", n)
        made["files", n] = files
        lmdb = bench_data_root / f"scale-lmdb-{n}"
        if not lmdb.exists():
            image_folder_to_lmdb(files, lmdb)
        made["lmdb", n] = lmdb
    return made


def _small_files(root: Path, n: int) -> Path:
    """``n`` files of 200-499 random bytes in CLASSES folders, written once (to a sibling, then renamed)."""
    if root.exists():
        return root
    partial = root.with_name(root.name + f".partial-{os.getpid()}")
    payload = os.urandom(512)
    try:
        for c in range(CLASSES):
            folder = partial / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(c * n // CLASSES, (c + 1) * n // CLASSES):
                (folder / f"{i:08d}.jpg").write_bytes(payload[i % 7 : i % 7 + 200 + i % 300])
        partial.rename(root)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    time.sleep(2.5)  # as a dataset made before the job: its folders settled (``loader.sources._listing``)
    return root


def _job(measure: str, fmt: str, kind: str, data: Path, cache_dir: Path) -> dict:
    env = {**os.environ, "STALLBENCH_CACHE_DIR": str(cache_dir)}
    out = subprocess.run(
        [sys.executable, str(JOB), measure, fmt, kind, str(data), str(cache_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_cost_as_the_dataset_grows(benchmark, data, tmp_path):
    rows = []

    def run() -> None:
        for fmt, kinds in LOADERS.items():
            for n in SIZES:
                for kind in kinds:
                    home = tmp_path / f"{fmt}-{n}-{kind}"  # a fresh cache home: the job's first run
                    home.mkdir()
                    first = _job("first-batch", fmt, kind, data[fmt, n], home)
                    second = _job("first-batch", fmt, kind, data[fmt, n], home)
                    hits = _job("hit-cpu", fmt, kind, data[fmt, n], home)
                    rows.append(dict(fmt=fmt, n=n, kind=kind, first=first, second=second, hits=hits))
                    shutil.rmtree(home)

    benchmark.pedantic(run, rounds=1, iterations=1)
    print(_table(rows))
    benchmark.extra_info["rows"] = rows
    _judge(rows)


def _table(rows: list[dict]) -> str:
    headers = [
        "data",
        "records",
        "loader",
        "build 1st/2nd s",
        "first batch 1st/2nd s",
        "x torch 1st/2nd",
        "build us/record",
        "hit CPU us/record",
        "index B/record",
        "store B/record (record B)",
    ]
    torch = {(r["fmt"], r["n"]): r for r in rows if r["kind"] == "torch"}
    table = []
    for r in rows:
        t, first, second, hits = torch[r["fmt"], r["n"]], r["first"], r["second"], r["hits"]
        held = "-"
        if "record_bytes" in hits:
            held = f"{hits['store_bytes_per_record']:.1f} ({hits['record_bytes']:.1f})"
        table.append(
            [
                r["fmt"],
                f"{r['n']:,}",
                r["kind"],
                f"{first['build']:.2f} / {second['build']:.2f}",
                f"{first['first_batch']:.2f} / {second['first_batch']:.2f}",
                f"{first['first_batch'] / t['first']['first_batch']:.2f} / "
                f"{second['first_batch'] / t['second']['first_batch']:.2f}",
                f"{first['build'] / r['n'] * 1e6:.2f}",
                f"{hits['cpu_us']:.1f}",
                f"{hits['index_bytes_per_record']:.1f}" if "index_bytes_per_record" in hits else "-",
                held,
            ]
        )
    return plain_table(headers, table)


COSTS = {  # what must grow no faster than the records: each per record
    "build, first run": lambda r: r["first"]["build"],
    "first batch, first run": lambda r: r["first"]["first_batch"],
    "hit CPU": lambda r: r["hits"]["cpu_us"] * r["n"],
}


def _judge(rows: list[dict]) -> None:
    by = {(r["fmt"], r["n"], r["kind"]): r for r in rows}
    failures = [*_not_linear(by), *_over_targets(by)]
    assert not failures, "\n".join(failures)


def _not_linear(by: dict) -> Iterator[str]:
    big, mid = SIZES[-1], SIZES[-2]
    for fmt, kinds in LOADERS.items():
        for kind in kinds[1:]:  # ours: torch's own growth is not ours to judge
            for label, cost in COSTS.items():
                ratio = (cost(by[fmt, big, kind]) / big) / (cost(by[fmt, mid, kind]) / mid)
                if ratio > LINEAR:
                    yield f"{fmt} {kind}: {label} per record, {big:,} against {mid:,}: {ratio:.2f}x"


def _over_targets(by: dict) -> Iterator[str]:
    big = SIZES[-1]
    for fmt, kinds in LOADERS.items():
        for kind in kinds[1:]:  # ours
            for n in SIZES:
                index = by[fmt, n, kind]["hits"]["index_bytes_per_record"]
                if index > MAX_INDEX_BYTES:
                    yield f"{fmt} {kind} {n:,}: {index:.1f} index bytes per record"
            for run in ("first", "second"):
                ratio = by[fmt, big, kind][run]["first_batch"] / by[fmt, big, "torch"][run]["first_batch"]
                if ratio > FIRST_BATCH:
                    yield f"{fmt} {kind} {big:,}, {run} run: first batch {ratio:.2f}x torch's"
    relist = by["files", big, "ours"]["second"]["build"]
    if relist > RELIST_SECONDS:
        yield f"listing an unchanged {big:,}-file folder again took {relist:.2f} s"
