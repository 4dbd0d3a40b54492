"""The form the cache holds its records in: raw bytes, prepared (the deterministic half of a staged transform,
``loader.fetching.staged``, done once), or a mix, chosen by measurement (``cache_form``).

``prepared``: the store of prepared records; ``choice``: the probe of a few records when the loader is made
and the form it picks; ``weighing``: the model that weighs a steady epoch in each form; ``revisit``: the
choice made again from the job's own records as the cache fills ([prepared
records](../../docs/concepts/prepared-cache.md)). The loader opens a dataset's cache in the form chosen
(``loader.dataloader.source_cache``).
"""
