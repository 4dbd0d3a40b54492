"""How batches go from the workers to the training loop, and what a worker leaves behind.

``collate``: a source-backed loader's collate (skipped records dropped, timed, storage reads counted);
``batch_ring`` and ``ring_collate``: large batch tensors stacked by the worker into slots the iterator keeps,
not a fresh shared-memory segment each; ``ready_first`` and ``collated_pieces``: batches made of the
samples ready first (``ready_first=True``); ``shared_heap``: forked workers that pin none of the job's free
memory; ``orphan_guard``: a worker whose parent died ends on its own; ``dead_workers``: what a killed worker
left in /dev/shm, removed.
"""
