"""The form the cache holds its records in: raw bytes, prepared (the deterministic half of a staged transform
done once), or a mix, chosen by measurement (``cache_form``).

``staged``: the two-stage transform (``Staged``) and a prepared record's layout; ``prepared``: the store of
prepared records; ``choice``: the probe of a few records when the loader is made and the form it picks;
``weighing``: the model that weighs a steady epoch in each form; ``revisit``: the choice made again from the
job's own records as the cache fills; ``source_cache``: a source-backed dataset's cache opened in that form
and size ([prepared records](../../docs/concepts/prepared-cache.md)).
"""
