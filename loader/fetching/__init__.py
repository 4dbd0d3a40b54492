"""A record from the cache or storage to a sample: fetched, read ahead, decoded and transformed.

``fetched``: one record's fetch through the cache (hit, or read and admitted) and what it cost;
``readahead``: a batch's records read on threads while others decode, where it pays; ``staged``: a
transform in two stages, the first deterministic (what lets the cache hold a record prepared), and a
prepared record's layout; ``decode``: the train and eval transforms without torchvision, staged; ``images``:
the image operations under them; ``pil``: which PIL build is active.
"""
