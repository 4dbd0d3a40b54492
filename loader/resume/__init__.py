"""Resuming a loader exactly, mid-epoch or between epochs, in a new process.

``position``: the random states an epoch's order was drawn from and the batches handed out; ``resumable``:
``state_dict()`` and ``load_state_dict()``; ``tracking``: the iterators' side, each batch handed out counted
with the random states its worker stamped on it; ``worker_random``: each worker's ``random``, ``torch`` and
``numpy`` states, kept with its batches and taken up again; ``sampler_states``: a sampler's own
``state_dict()`` over an epoch; ``world_change``: the rest of a ``DistributedSampler``'s epoch dealt again
among another number of ranks.
"""
