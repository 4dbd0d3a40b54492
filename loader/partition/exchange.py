"""The exchange between nodes, on ``torch.distributed`` (its own gloo group), in the ranks' main processes.

Driven by the epoch's order, which every rank knows in advance (``plan``): a node's leader runs one sender
thread per rank of another node, and walks that rank's order, sending for each chunk of it the records
its node owns (from its cache, or from storage, admitting them); each rank runs one receiver thread per other
node, and stages what arrives in its inbox for its workers, at most ``ahead`` records at a time, so the
exchange runs ahead of need while the training step runs. A message is the records' sizes (int64), then
their bytes (uint8). A send or receive that fails or passes the group's timeout marks that peer gone: the
receiver says so to the workers (``Inbox.mark_gone``), who then read its records from storage. At the
start of each epoch a receiver sends its rank's split (``split``: the records it reads from storage
instead), and both sides leave those out.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from loader.partition.inbox import Inbox
from loader.partition.plan import Layout, chunks_for
from loader.partition.split import Split

__all__ = ["Exchange", "Plan"]


_SPLIT_TAG = 1  # the receiving rank's split, apart from the records (tag 0) between the same two ranks


class Plan:
    """One epoch between one pair of ranks: the receiving rank's order (and, on its side, its split);
    ``abandoned`` once the receiving loop left the epoch."""

    def __init__(self, order: list[int], split: Split | None = None) -> None:
        self.order, self.split = order, split if split is not None else Split()
        self.abandoned = False


class Exchange:
    """The threads of this rank; ``start_epoch`` hands each its part of an epoch."""

    def __init__(
        self, group: Any, layout: Layout, inbox: Inbox, read_owned: Callable[[int], bytes], ahead: int
    ) -> None:
        self.group, self.layout, self.inbox, self.ahead = group, layout, inbox, ahead
        self.read_owned = read_owned
        self.gone: set[int] = set()  # nodes (receiving side) and ranks (sending side) found gone
        self.counts = {"bytes_received": 0, "records_received": 0, "bytes_sent": 0, "records_sent": 0}
        self._lock = threading.Lock()
        self._buffers = threading.local()
        self._senders = {q: queue.Queue() for q in self._clients()}
        self._receivers = {n: queue.Queue() for n in range(layout.nodes) if n != layout.node}
        self._current: list[Plan] = []
        for q, plans in self._senders.items():
            threading.Thread(target=self._send_loop, args=(q, plans), daemon=True, name=f"send-r{q}").start()
        for n, plans in self._receivers.items():
            threading.Thread(
                target=self._receive_loop, args=(n, plans), daemon=True, name=f"recv-n{n}"
            ).start()

    def _clients(self) -> list[int]:
        """Ranks this rank serves: every rank of another node, if this rank leads its node."""
        lay = self.layout
        return [q for q in range(len(lay.node_of)) if lay.node_of[q] != lay.node] if lay.leads else []

    def end_epoch(self) -> None:
        """Before the next epoch's workers start: what the last epoch still receives is dropped (a loop that
        left it early), and its records no worker took go (that, or ``drop_last``)."""
        for plan in self._current:
            plan.abandoned = True
        self.inbox.clear()

    def start_epoch(self, order_of_rank: Callable[[int], list[int]], split: Split) -> None:
        """Queue an epoch (after ``end_epoch``): ``order_of_rank(r)`` is rank r's order, the same on every
        rank; ``split`` this rank's (its receivers send it to the nodes that serve it)."""
        for q, plans in self._senders.items():
            plans.put(Plan(order_of_rank(q)))
        mine = order_of_rank(self.layout.rank)
        self._current = [Plan(mine, split) for _ in self._receivers]
        for plan, plans in zip(self._current, self._receivers.values(), strict=True):
            plans.put(plan)

    def _send_loop(self, q: int, plans: queue.Queue) -> None:
        lay = self.layout
        try:
            while True:
                order = plans.get().order
                header = torch.empty(2, dtype=torch.float64)
                dist.recv(header, src=q, group=self.group, tag=_SPLIT_TAG)
                split = Split(int(header[0]), float(header[1]))
                for chunk in chunks_for(order, lay, lay.node, split):
                    if chunk:
                        self._send(q, [self.read_owned(i) for i in chunk])
        except Exception:  # the peer is gone or timed out: it reads our records from storage
            self.gone.add(q)

    def _send(self, q: int, records: list[bytes]) -> None:
        sizes = torch.tensor([len(r) for r in records], dtype=torch.int64)
        payload = self._payload(int(sizes.sum()))
        view, at = payload.numpy(), 0
        for record in records:  # one copy into the message
            view[at : at + len(record)] = memoryview(record)
            at += len(record)
        dist.send(sizes, dst=q, group=self.group)
        if len(payload):
            dist.send(payload, dst=q, group=self.group)
        self._add(bytes_sent=len(payload), records_sent=len(records))

    def _receive_loop(self, node: int, plans: queue.Queue) -> None:
        leader = self.layout.leader(node)
        try:
            while True:
                plan = plans.get()
                header = torch.tensor([plan.split.epoch, plan.split.share], dtype=torch.float64)
                dist.send(header, dst=leader, group=self.group, tag=_SPLIT_TAG)
                for chunk in chunks_for(plan.order, self.layout, node, plan.split):
                    if chunk:
                        self._wait_for_room(plan)
                        self._receive(leader, chunk, plan)
        except Exception:
            self.gone.add(node)
            self.inbox.mark_gone(node)

    def _wait_for_room(self, plan: Plan) -> None:
        while not plan.abandoned and self.inbox.waiting() >= self.ahead:
            time.sleep(0.002)

    def _receive(self, leader: int, chunk: list[int], plan: Plan) -> None:
        sizes = torch.empty(len(chunk), dtype=torch.int64)
        dist.recv(sizes, src=leader, group=self.group)
        payload = self._payload(int(sizes.sum()))
        if len(payload):
            dist.recv(payload, src=leader, group=self.group)
        if plan.abandoned:
            return
        # counted before the records are put where the loader takes them: counted after, a job that took
        # them and read its stats at once could see hits from peers not yet received (seen under load)
        self._add(bytes_received=len(payload), records_received=len(chunk))
        view, at = memoryview(payload.numpy()), 0
        for index, size in zip(chunk, sizes.tolist(), strict=True):
            self.inbox.put(index, view[at : at + size])
            at += size

    def _payload(self, size: int) -> torch.Tensor:
        """``size`` bytes of this thread's message buffer, kept from message to message: a fresh one costs
        its page faults on every message (a send or receive is done with it when it returns)."""
        buffer = getattr(self._buffers, "tensor", None)
        if buffer is None or len(buffer) < size:
            buffer = self._buffers.tensor = torch.empty(size, dtype=torch.uint8)
        return buffer[:size]

    def _add(self, **amounts: int) -> None:
        with self._lock:
            for key, amount in amounts.items():
                self.counts[key] += amount
