"""``DataLoader(cache_files=...)``: a Dataset that opens its own files, its reads served by the cache.

``files``: ``CachedFiles``, any file under some folders read through a store, never stale; ``open_hook``:
Python's ``open`` replaced in each process that runs the Dataset, serving its plain reads of those files;
``served_file``: the file object a served read gives; ``held_reads``: a batch's reads held for admission at
its end ([your own Dataset](../../docs/how-to/your-own-dataset.md)).
"""
