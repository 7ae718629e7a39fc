# Two entry points: `make demo` (set up + main job) and `make test` (set up + tests).
# Each creates .venv from the pinned constraints on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
WORKDIR ?= workdirs/demo

.PHONY: setup demo test clean

$(STAMP): setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)  # Starts afresh: a kept workdir would resume its finished run.
	rm -rf $(WORKDIR)
	$(VENV)/bin/python -m vit_jax.main --config=configs/digits.py --workdir=$(WORKDIR)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 tests

clean:
	rm -rf $(VENV) workdirs
