# make demo: install, then run the demo job on a dataset it generates; make test: install, then run the tests.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test bench lint

install:
	@bash scripts/install.sh $(VENV)

demo: install
	$(PY) -m stallbench demo

test: install
	$(PY) -m pytest

bench: install
	$(PY) -m pytest benchmarks -p no:cacheprovider --benchmark-enable --benchmark-columns=mean,rounds -s

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
