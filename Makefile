# Two entry points: `make demo` (set up + main job) and `make test` (set up + tests).
# Each creates .venv from the pinned constraints on first use: the demo
# installs the package alone, the tests add their extras (libtpu, the GCS
# emulator, the linters) and, where it comes without a large download, the
# PyTorch environment of the timm side of benchmarks/gpu_check.sh.
#
# The venv's Python: PYTHON=... if given, else what launch/find_python.sh
# finds (python3 if it is 3.12+, else the newest python3.13 / python3.12 that
# runs, on PATH or under pyenv). A change of setup.py or constraints.txt
# rebuilds .venv from nothing, so it holds exactly the pinned versions.
ifndef PYTHON
PYTHON := $(shell launch/find_python.sh 2>/dev/null)
endif
VENV := .venv
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
TORCH_VENV := .venv-torch
WORKDIR ?= workdirs/demo
VIT_JAX := $(VENV)/bin/vit-jax

# Where the code style (pyproject.toml: yapf formats, ruff lints) applies.
STYLED := setup.py vit_jax configs tests benchmarks launch

.PHONY: setup demo test test-all lint format clean torch-env references

$(STAMP): setup.py constraints.txt
	@test -n "$(PYTHON)" || launch/find_python.sh  # Says what to install.
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints.txt -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(VENV)/bin/pip install --quiet -c constraints.txt -e ".[test,tpu]"
	touch $(TEST_STAMP)

setup: $(STAMP)

# PyTorch's CPU build for the timm side of the GPU check's dry run and for
# regenerating tests/references (tests/references/torch_env.sh says where
# it comes from; without it those parts of the suite are skipped, naming it).
torch-env:
	tests/references/torch_env.sh $(TORCH_VENV)

# What timm and transformers compute, stored for the suite (which runs
# without PyTorch): tests/references/stored.py.
references: torch-env
	$(TORCH_VENV)/bin/python -m tests.references.generate

# Pre-trains on digits at 16 px, then fine-tunes that checkpoint at 32 px
# (position embeddings resized, new head); each prints its test accuracy.
# Then pre-trains the same model self-supervised (a masked autoencoder, no
# labels read), and prints the few-shot linear accuracies of its features
# next to random-init and supervised features. Last, it writes the paper's
# figures of what the pre-trained model learnt into its workdir.
demo: $(STAMP)  # Starts afresh: a kept workdir would resume its finished run.
	rm -rf $(WORKDIR)
	@echo "== 1/5 Pre-training on digits at 16 px"
	$(VIT_JAX) train --config=configs/digits.py --workdir=$(WORKDIR)/pretrain
	@echo "== 2/5 Fine-tuning that checkpoint at 32 px"
	$(VIT_JAX) train --config=configs/finetune.py:digits \
	    --workdir=$(WORKDIR)/finetune --config.init.checkpoint=$(WORKDIR)/pretrain
	@echo "== 3/5 Self-supervised pre-training (a masked autoencoder, MAE) at 16 px"
	$(VIT_JAX) train --config=configs/mae.py:digits --workdir=$(WORKDIR)/selfsup
	@echo "== 4/5 Few-shot linear accuracy: self-supervised, random init, supervised"
	$(VIT_JAX) fewshot --config=configs/fewshot.py:digits --workdir=$(WORKDIR)/fewshot \
	    --checkpoints=$(WORKDIR)/selfsup,random,$(WORKDIR)/pretrain
	@echo "== 5/5 What the pre-trained model learnt: the paper's figures"
	$(VIT_JAX) analyze --checkpoint=$(WORKDIR)/pretrain

# The style first (seconds), then the suite: one worker a core (the
# multi-process tests start two processes of their own), and the 15 slowest
# tests listed at the end, so that a slower landing shows. `test` is the
# quick tier (tests marked `full` left out: several processes, an
# emulator's faults, long trainings); `test-all`, what CI runs, is all.
PYTEST := $(VENV)/bin/python -m pytest -n 2 --dist loadgroup --durations=15

test: lint torch-env
	$(PYTEST) -m "not full" tests

test-all: lint torch-env
	$(PYTEST) tests

lint: $(TEST_STAMP)
	$(VENV)/bin/yapf --diff --recursive --parallel $(STYLED)
	$(VENV)/bin/ruff check $(STYLED)

format: $(TEST_STAMP)
	$(VENV)/bin/ruff check --fix --exit-zero --quiet $(STYLED)
	$(VENV)/bin/yapf --in-place --recursive --parallel $(STYLED)

clean:
	rm -rf $(VENV) $(TORCH_VENV) workdirs
