"""A user script that fails on demand: one line to stdout, one to stderr, then exit with ``argv[1]``.

It lets the tests check that stallbench hands a measured script's exit code and last output lines back
unchanged, without running a real training job.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    print(f"exit_code.py: stdout line, exiting with {code}", flush=True)
    print(f"exit_code.py: stderr line, exiting with {code}", file=sys.stderr, flush=True)
    sys.exit(code)
