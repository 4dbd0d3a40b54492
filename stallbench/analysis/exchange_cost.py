"""What a record from a peer costs in CPU: records through the loader's own exchange between two processes.

The nodes what-if (``stallbench.analysis.nodes``) predicts the epoch of a partitioned cache, whose remote
records come from the other nodes through ``loader.partition.exchange.Exchange``: a sender thread copies
them into messages, gloo carries them, a receiver thread writes each into the rank's inbox, and a worker
takes it from there (about 250 us of CPU per 112 KB record on this machine, ``bench_partition``). That cost
is measured, not assumed: two processes, one gloo group over loopback as ``partition_cache`` makes one,
each a node of its own, serve each other the records they own from memory through that exchange, and each
takes the other's from its inbox in its own shuffled order, as its workers would. The cost is what a
process spent (its threads' sending and receiving and its taking: ``time.process_time``) per record it
received: a node on N nodes sends about as much as it receives. Two rounds, of small and of large records,
give a cost per record (the inbox's file, the digest, a message's share) and one per byte (the copies), so
any record size has its cost without a probe of its own. Over loopback the exchange is bound by that CPU, so
its rate here says nothing more; between real nodes the network adds a limit of its own, which no
measurement on one machine shows.

The probe takes about 3 s (two processes that import torch), so its result is kept for this boot in the
user's private cache folder (``$XDG_CACHE_HOME/stallbench/exchange-cost.json``, ``~/.cache`` by default,
checked as the loader checks its own files) and measured again after a reboot, or where the file is
missing, damaged or not ours. The probe's inboxes live in a scratch folder of its own in /dev/shm
(``stallbench.jobs.run.scratch_cache_dir``), removed after it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from stallbench.jobs.run import scratch_cache_dir

__all__ = ["ExchangeCost", "exchange_cost", "measure_exchange_cost"]

SIZES = ((8192, 512), (1 << 20, 64))  # (record bytes, records) of the probe's two rounds
TIMEOUT_S = 120
KEPT = "exchange-cost.json"


@dataclass(frozen=True)
class ExchangeCost:
    """CPU seconds a node spends on a record it takes from a peer: per record, and per byte of it."""

    per_record_s: float
    per_byte_s: float

    def per_byte(self, record_bytes: int) -> float:
        """CPU seconds per byte of records of ``record_bytes``."""
        return self.per_record_s / record_bytes + self.per_byte_s


def exchange_cost() -> ExchangeCost:
    """The cost kept for this boot, or measured now (and kept)."""
    kept = _read_kept()
    if kept is not None:
        return kept
    cost = measure_exchange_cost()
    _keep(cost)
    return cost


def measure_exchange_cost(*, timeout: float = TIMEOUT_S) -> ExchangeCost:
    """Both rounds through the exchange between two processes on loopback (per round, the larger of the two
    processes' costs). A process that fails, or does not finish within ``timeout`` seconds (a stopped one),
    fails the probe with a RuntimeError; both are then killed and their inboxes removed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inboxes = scratch_cache_dir("/dev/shm")
    argv = [sys.executable, "-m", __name__, str(inboxes), str(port), str(round(timeout))]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks = [subprocess.Popen([*argv, str(r)], **pipes) for r in (0, 1)]
    try:
        finished = _wait(ranks, timeout)
    finally:
        for p in ranks:
            p.kill()
        outs = [p.communicate() for p in ranks]  # what they wrote, and their pipes closed
        shutil.rmtree(inboxes, ignore_errors=True)
    if not finished:
        raise RuntimeError(f"the exchange probe took over {timeout:g} s")
    failed = [(p.returncode, err) for p, (_, err) in zip(ranks, outs, strict=True) if p.returncode]
    if failed:  # the one that said why first, rather than the one killed here after it
        code, err = sorted(failed, key=lambda f: not f[1].strip())[0]
        raise RuntimeError(f"the exchange probe exited with {code}: {err.strip()[-500:]}")
    rounds = zip(*(json.loads(out.strip().splitlines()[-1]) for out, _ in outs), strict=True)
    (small, small_cpu), (large, large_cpu) = ((s, max(r)) for (s, _), r in zip(SIZES, rounds, strict=True))
    per_byte = max(0.0, (large_cpu - small_cpu) / (large - small))
    return ExchangeCost(max(0.0, small_cpu - per_byte * small), per_byte)


def _wait(ranks: list[subprocess.Popen], timeout: float) -> bool:
    """Until both processes exit, or one fails (the other would wait for it): False past ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in ranks]
        if all(c is not None for c in codes) or any(codes):
            return True
        time.sleep(0.01)
    return False


def _kept_folder() -> Path:
    """This user's private ``stallbench`` folder in their cache folder (made 0700, or checked)."""
    from loader.system.private import private_dir  # here: the command line starts without loader

    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home.mkdir(parents=True, exist_ok=True)
    return private_dir(home, "stallbench")


def _boot() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _read_kept() -> ExchangeCost | None:
    """The kept cost, where it is this boot's, ours and whole; else None."""
    from loader.system.private import open_private

    try:
        fd = open_private(_kept_folder(), KEPT, os.O_RDONLY)
    except OSError:  # none kept, not ours, or no cache folder to be had
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(4096)
    with contextlib.suppress(ValueError, TypeError, LookupError, AttributeError):
        kept = json.loads(raw)
        cost = ExchangeCost(float(kept["per_record_s"]), float(kept["per_byte_s"]))
        if kept["boot"] == _boot() and all(math.isfinite(x) and x >= 0 for x in asdict(cost).values()):
            return cost
    return None


def _keep(cost: ExchangeCost) -> None:
    """Written whole under a name of this process (one a dead process of the same pid left is removed
    first: the folder is ours alone), then renamed over the kept file; where that fails (a full disk, a
    home that cannot be written), the cost is only not kept."""
    from loader.system.private import write_new

    with contextlib.suppress(OSError):
        folder = _kept_folder()
        tmp = folder / f".{KEPT}-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        write_new(tmp, [json.dumps({"boot": _boot(), **asdict(cost)}).encode()])
        os.replace(tmp, folder / KEPT)


def _node(inboxes: Path, port: int, timeout: int, rank: int) -> list[float]:
    """One process of the probe: each round, serve the records it owns and take the other's, in its own
    order; the CPU it spent per record taken, per round."""
    import torch.distributed as dist

    from loader.instrument import Exchange, Inbox, Layout, Split

    wait = datetime.timedelta(seconds=timeout)  # an orphan whose peer is gone ends by itself
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=wait
    )
    layout, owned, costs = Layout((0, 1), rank), {}, []
    inbox = Inbox.make(inboxes, rank)
    try:
        exchange = Exchange(dist.group.WORLD, layout, inbox, owned.__getitem__, ahead=2 * 32)
        for record_bytes, records in SIZES:
            owned.clear()
            owned.update({i: os.urandom(record_bytes) for i in range(rank, records, 2)})
            orders = [random.Random(r).sample(range(records), records) for r in (0, 1)]
            dist.barrier()
            cpu = time.process_time()
            exchange.start_epoch(orders.__getitem__, Split())
            remote = [i for i in orders[rank] if not layout.local(i)]
            for index in remote:
                if inbox.take(index, layout.owner(index), timeout=timeout) is None:
                    raise RuntimeError(f"the exchange probe's record {index} never came")
            costs.append((time.process_time() - cpu) / len(remote))
            dist.barrier()
            exchange.end_epoch()
    finally:
        inbox.remove()
    return costs


if __name__ == "__main__":
    try:
        print(json.dumps(_node(Path(sys.argv[1]), *(int(a) for a in sys.argv[2:5]))), flush=True)
    except Exception as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)  # the exchange's threads wait on gloo forever: no interpreter shutdown to wait for them
