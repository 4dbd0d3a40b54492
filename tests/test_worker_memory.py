"""A worker's own memory over a big dataset (issue 46, the peers' users' "memory grows with workers": a big
index read by every worker copies itself into each, page by page, as Python touches its objects): 16 workers
over an LMDB of a million records and a cache indexing all of them, each worker's own memory (USS: its
private pages, none it shares with the job's process, however large that grows) measured early and after
it has read records from all over the index. Measured 12-06: 12.5-12.7 MiB a worker, +0.1-0.2 MiB after
5,120 more records; the same reads through torch's loader over a Dataset keeping its million keys in a
Python list grew each worker by 14-15 MiB (its objects' refcounts written, their pages copied)."""

from __future__ import annotations

import numpy as np
import psutil
import pytest
import torch

from loader import DataLoader, LMDBDataset
from loader.cache import index_bytes
from loader.sources.lmdb_source import LABELS_KEY, LEN_KEY, pack_record, record_key

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]
RECORDS, WORKERS, BATCH = 1_000_000, 16, 256
MIB = 1 << 20


@pytest.fixture(scope="module")
def million(tmp_path_factory):
    import lmdb

    path = tmp_path_factory.mktemp("million") / "db"
    env = lmdb.open(str(path), map_size=1 << 30, lock=False, sync=False)
    with env, env.begin(write=True) as txn:
        for i in range(RECORDS):
            txn.put(record_key(i), pack_record(i % 10, i.to_bytes(8, "little")), append=True)
        txn.put(LABELS_KEY, (np.arange(RECORDS, dtype=">i4") % 10).tobytes())
        txn.put(LEN_KEY, str(RECORDS).encode())
    return path


def own(pid: int) -> int:
    """The memory only process ``pid`` holds (USS: its private pages; none it shares with its parent)."""
    return psutil.Process(pid).memory_full_info().uss


def first_of(batch) -> int:
    return int.from_bytes(batch, "little")


@pytest.mark.filterwarnings("ignore:This DataLoader will create 16 worker processes")  # on 2 cores: as asked
def test_sixteen_workers_over_a_million_records_each_stay_flat(million, tmp_path):
    dataset = LMDBDataset(str(million), transform=first_of)
    dl = DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        num_workers=WORKERS,
        generator=torch.Generator().manual_seed(0),
        cache_bytes=index_bytes(RECORDS) + RECORDS * 8,
        cache_dir=tmp_path,
    )
    it = iter(dl)
    seen = [next(it) for _ in range(2 * WORKERS)]  # each worker has made two batches
    workers = [w.pid for w in it._workers]
    early = {pid: own(pid) for pid in workers}
    seen += [next(it) for _ in range(20 * WORKERS)]  # each 5,000 records more, spread over the index
    late = {pid: own(pid) for pid in workers}
    del it
    samples = torch.cat([batch[0] for batch in seen])
    assert len(samples.unique()) == len(samples) == 22 * WORKERS * BATCH  # whole records, none repeated
    growth = {pid: late[pid] - early[pid] for pid in workers}
    assert max(growth.values()) < 2 * MIB, {pid: f"{g / MIB:.1f} MiB" for pid, g in growth.items()}
    assert max(late.values()) < 32 * MIB, {pid: f"{m / MIB:.1f} MiB" for pid, m in late.items()}
