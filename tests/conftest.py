"""Test set-up: 8 simulated CPU devices, quiet TensorFlow, a local TFDS dir,
the compilation cache of this clone, and deprecations as errors."""

import gc
import os
import re

import pytest

from tests import tiers
from tests.helpers import processes
from tests.helpers import torch_env

# Must happen before JAX initialises its backends.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                           processes.xla_flags(8))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# libtpu (the `tpu` extra, for compiling TPU plans) must not look for a TPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Tests and the commands they run as subprocesses compile the same programs
# again and again (each test builds its own step functions): they share
# JAX's persistent compilation cache, this clone's own (so a fresh clone
# starts cold). A program read from it keeps its cost and memory analyses.
# JAX locks the cache's files only where it bounds its size: with a bound,
# no process reads an entry another is still writing. Each write then
# looks through every entry, so only programs that took 0.3 s or more to
# compile are kept (a few hundred; the thousands of single operations
# compile in milliseconds).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", processes.CACHE_DIR)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))

# Every deprecation is an error, in the tests and in the commands they start
# (PYTHONWARNINGS, which the subprocesses inherit): what JAX, Flax, Optax,
# Orbax, TFDS or this package announce fails here before an upgrade breaks
# it. Noise from code we cannot change is let through by the start of its
# exact message, each with the reason:
THIRD_PARTY_DEPRECATIONS = [
    # ml_collections 1.1.0 (its latest release) loads config files with
    # SourceFileLoader.load_module(), which Python deprecated in 3.4.
    ("the load_module() method is deprecated and slated for removal in "
     "Python 3.12; use exec_module() instead", "DeprecationWarning"),
]
_AS_ERRORS = ("DeprecationWarning", "PendingDeprecationWarning",
              "FutureWarning")
# So are the compilation cache's warnings: an entry read while another
# process wrote it, or one it cannot read back.
CACHE_WARNINGS = [("Error reading persistent compilation cache", "UserWarning"),
                  ("Error writing persistent compilation cache", "UserWarning")]
# PYTHONWARNINGS splits on commas and colons and matches the start of a
# message literally.
assert not any(
    "," in m or ":" in m for m, _ in THIRD_PARTY_DEPRECATIONS + CACHE_WARNINGS)
os.environ["PYTHONWARNINGS"] = ",".join(
    [f"error::{c}" for c in _AS_ERRORS] +
    [f"error:{m}:{c}" for m, c in CACHE_WARNINGS] +
    [f"ignore:{m}:{c}" for m, c in THIRD_PARTY_DEPRECATIONS])


def pytest_configure(config):
  """The same policy in this process (pytest's filters, later ones win)."""
  for category in _AS_ERRORS:
    config.addinivalue_line("filterwarnings", f"error::{category}")
  for message, category in CACHE_WARNINGS:
    config.addinivalue_line("filterwarnings",
                            f"error:{re.escape(message)}:{category}")
  for message, category in THIRD_PARTY_DEPRECATIONS:
    config.addinivalue_line("filterwarnings",
                            f"ignore:{re.escape(message)}:{category}")


def pytest_sessionfinish(session):
  """The session's last garbage collection, then the survivors frozen.

  An xdist worker ends within 5 s of being told to, or execnet sends it
  SIGINT; pytest's cleanup then collects garbage 5 times, and a worker
  that ran many JAX tests holds millions of objects (about 2 s a
  collection): the SIGINT lands in JAX's gc callback, and the suite ended
  with a PytestUnraisableExceptionWarning (`_xla_gc_callback`,
  KeyboardInterrupt) per worker. Collected here, before the worker reports
  that it has finished (an unraisable exception found is still reported),
  pytest's collections scan only what is made after.
  """
  del session
  gc.collect()
  gc.freeze()


def pytest_collection_modifyitems(config, items):
  """Marks the full tier's tests `full` (`tests/tiers.py`); a name there
  that no test of its module has fails the collection."""
  del config
  by_module = {}
  for item in items:
    module = item.module.__name__.rpartition(".")[2]
    by_module.setdefault(module, []).append(item)
  unknown = []
  for module, names in tiers.FULL.items():
    collected = by_module.get(module, [])
    functions = {item.originalname for item in collected}
    if collected and names != tiers.ALL:
      unknown += [f"{module}::{n}" for n in names if n not in functions]
    for item in collected:
      if names == tiers.ALL or item.originalname in names:
        item.add_marker(pytest.mark.full)
  if unknown:
    raise pytest.UsageError("tests/tiers.py names tests that do not exist: "
                            f"{', '.join(unknown)}.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Under CI=true, a comparison with timm skipped for want of .venv-torch
  fails (`torch_env`)."""
  del item, call
  outcome = yield
  torch_env.fail_skip_in_ci(outcome.get_result())


@pytest.fixture(scope="session")
def tfds_data_dir(tmp_path_factory) -> str:
  """A TFDS data_dir with the built-in digits dataset prepared (no network),
  in ArrayRecord files as `vit-jax train` prepares it."""
  import tensorflow_datasets as tfds

  from vit_jax.data import digits  # noqa: F401  (registers the builder)
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  tfds.builder("digits", data_dir=data_dir,
               file_format="array_record").download_and_prepare()
  return data_dir


@pytest.fixture
def digits_config(tfds_data_dir):
  """The demo config in its `runlocal` form, reading the test's data_dir."""
  from configs import digits
  config = digits.get_config("runlocal")
  config.data_dir = tfds_data_dir
  return config


@pytest.fixture(scope="session")
def trained_digits_run(tfds_data_dir, tmp_path_factory) -> tuple[str, dict]:
  """(a workdir holding the `digits` model trained at 16 px for 400 steps,
  evaluated at step 200 and at the end, its first steps profiled; its
  final metrics).

  Tests using it share one xdist worker (`xdist_group('trained_digits')`),
  so it is trained once per run.
  """
  from configs import digits
  from vit_jax.loop import trainer
  config = digits.get_config("runlocal")
  config.data_dir = tfds_data_dir
  config.model.variant = "digits"
  config.total_steps = 400
  config.warmup_steps = 20
  config.lr = 3e-3
  config.log_every_steps = 100
  config.eval_every_steps = 200
  config.profile_steps = 2
  workdir = str(tmp_path_factory.mktemp("trained_digits"))
  return workdir, trainer.train_and_evaluate(config, workdir)


@pytest.fixture(scope="session")
def trained_digits(trained_digits_run) -> str:
  """The workdir of `trained_digits_run`."""
  return trained_digits_run[0]


@pytest.fixture
def selfsup_config(tfds_data_dir):
  """Masked patch prediction (configs/selfsup.py:digits,runlocal) on the
  test's data_dir."""
  from configs import selfsup
  config = selfsup.get_config("digits,runlocal")
  config.data_dir = tfds_data_dir
  return config
