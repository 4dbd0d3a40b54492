"""``python -m stallbench``: the command line."""

import sys

from stallbench.cli import main

sys.exit(main())
