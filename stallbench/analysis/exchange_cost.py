"""What a record from a peer costs in CPU: records through the loader's own exchange between two processes.

The nodes what-if (``stallbench.analysis.nodes``) predicts the epoch of a partitioned cache, whose remote
records come from the other nodes through ``loader.partition.exchange.Exchange``: a sender thread copies
them into messages, gloo carries them, a receiver thread writes each into the rank's inbox, and a worker
takes it from there (about 250 us of CPU per 112 KB record on this machine, ``bench_partition``). That cost
is measured, not assumed: two processes, one gloo group over loopback as ``partition_cache`` makes one,
each a node of its own, serve each other the records they own from memory through that exchange, and each
takes the other's from its inbox in its own shuffled order, as its workers would. The cost is what a
process spent (its threads' sending and receiving and its taking: ``time.process_time``) per byte it
received: a node on N nodes sends about as much as it receives. Over loopback the exchange is bound by that
CPU, so its rate here says nothing more (and depends on how the two processes share the cores); between
real nodes the network adds a limit of its own, which no measurement on one machine shows.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["measure_exchange_cpu"]

PROBE_BYTES = 24 << 20  # records exchanged by the two processes together, about
MIN_RECORDS, MAX_RECORDS = 64, 1024
TIMEOUT_S = 120


def measure_exchange_cpu(record_bytes: int, *, timeout: float = TIMEOUT_S) -> float:
    """CPU seconds per byte a node takes from a peer, records of ``record_bytes`` through the exchange
    between two processes on loopback (the larger of the two processes' costs). A process that fails,
    or does not finish within ``timeout`` seconds (a stopped one), fails the probe with a RuntimeError;
    both are then killed and their inboxes removed."""
    if record_bytes <= 0:
        raise ValueError(f"record_bytes must be positive, got {record_bytes!r}")
    records = max(MIN_RECORDS, min(MAX_RECORDS, PROBE_BYTES // record_bytes))
    records += records % 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", __name__, str(port), str(record_bytes), str(records), str(round(timeout))]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks = [subprocess.Popen([*argv, str(r)], **pipes) for r in (0, 1)]
    try:
        finished = _wait(ranks, timeout)
    finally:
        for p in ranks:
            p.kill()
        outs = [p.communicate() for p in ranks]  # what they wrote, and their pipes closed
        _sweep_inboxes()
    if not finished:
        raise RuntimeError(f"the exchange probe took over {timeout:g} s")
    failed = [(p.returncode, err) for p, (_, err) in zip(ranks, outs, strict=True) if p.returncode]
    if failed:  # the one that said why first, rather than the one killed here after it
        code, err = sorted(failed, key=lambda f: not f[1].strip())[0]
        raise RuntimeError(f"the exchange probe exited with {code}: {err.strip()[-500:]}")
    found = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    return max(f["cpu_seconds"] / f["bytes"] for f in found)


def _wait(ranks: list[subprocess.Popen], timeout: float) -> bool:
    """Until both processes exit, or one fails (the other would wait for it): False past ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in ranks]
        if all(c is not None for c in codes) or any(codes):
            return True
        time.sleep(0.01)
    return False


def _inboxes() -> Path:
    """Where a loader's inboxes are by default, and the probe's."""
    from loader.system.private import user_dir

    return user_dir(Path("/dev/shm"), "cache_dir")


def _sweep_inboxes() -> None:
    from loader.partition.inbox import Inbox

    Inbox.sweep(_inboxes())


def _node(port: int, record_bytes: int, records: int, timeout: int, rank: int) -> dict[str, float]:
    """One process of the probe: serve the records it owns, take the other's, in its own order."""
    import torch.distributed as dist

    from loader.partition.exchange import Exchange
    from loader.partition.inbox import Inbox
    from loader.partition.plan import Layout
    from loader.partition.split import Split

    init = f"tcp://127.0.0.1:{port}"
    wait = datetime.timedelta(seconds=timeout)  # an orphan whose peer is gone ends by itself
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=wait)
    layout = Layout((0, 1), rank)
    owned = {i: os.urandom(record_bytes) for i in range(rank, records, 2)}
    orders = [random.Random(r).sample(range(records), records) for r in (0, 1)]
    inbox = Inbox.make(_inboxes(), rank)
    try:
        exchange = Exchange(dist.group.WORLD, layout, inbox, owned.__getitem__, ahead=2 * 32)
        dist.barrier()
        cpu = time.process_time()
        exchange.start_epoch(orders.__getitem__, Split())
        received = 0
        for index in orders[rank]:
            if not layout.local(index):
                record = inbox.take(index, layout.owner(index), timeout=timeout)
                if record is None:
                    raise RuntimeError(f"the exchange probe's record {index} never came")
                received += len(record)
        cpu = time.process_time() - cpu
        dist.barrier()
    finally:
        inbox.remove()
    return {"bytes": received, "cpu_seconds": cpu}


if __name__ == "__main__":
    try:
        print(json.dumps(_node(*(int(a) for a in sys.argv[1:6]))), flush=True)
    except Exception as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)  # the exchange's threads wait on gloo forever: no interpreter shutdown to wait for them
