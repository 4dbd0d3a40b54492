"""Jobs stallbench runs: the user's own command (a bootstrap in each of its Python processes) and the
contract between the parent that runs it and the processes that measure (``spec``)."""
