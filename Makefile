# make demo: install, then run the demo job on a dataset it generates; make test: install, then run the tests.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install bytecode demo test bench lint

install:
	@bash scripts/install.sh $(VENV)

# The project's modules compiled ahead: every process a run starts (stallbench, its jobs, their workers)
# imports them, and where PYTHONDONTWRITEBYTECODE is set (this machine's shells set it) each would compile
# them from source again: 0.3 s a process, ~10% of the suite.
bytecode: install
	@$(PY) -m compileall -q -x '/(\.venv|build)/' loader stallbench tests benchmarks examples

demo: bytecode
	$(PY) -m stallbench demo

# The tests that start processes, take seconds or time what they run (markers slow, multiproc, serial) run
# one at a time, alone on the machine; the rest (~1,300 unit tests), two at once (pytest-xdist): 2 of the
# suite's ~20 minutes on this machine's 2 cores. Both halves run; either failing fails the target.
HEAVY := slow or multiproc or serial

test: bytecode
	@$(PY) -m pytest -m "$(HEAVY)"; heavy=$$?; \
	$(PY) -m pytest -m "not ($(HEAVY))" -n 2; light=$$?; \
	test $$heavy -eq 0 -a $$light -eq 0

bench: bytecode
	$(PY) -m pytest benchmarks -p no:cacheprovider --benchmark-enable --benchmark-columns=mean,rounds -s

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
