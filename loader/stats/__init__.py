"""What a loader counts and times (``stats()``): ``board``, the shared array every process that loads data
reports into, one row each; ``loader_stats``, what ``stats()`` returns from it."""
