"""What every command shares: its dispatch, flags, log level, error policy.

A command is a module of `vit_jax/commands/` (`vit-jax NAME` once
installed, or `python -m vit_jax NAME`; see `COMMANDS`) that defines its
flags and `main(argv)`; nothing in the library imports it. The entry point
(`vit_jax/__main__.py`) sets the environment before JAX loads; `dispatch`
imports the command's module and runs its `main` with `run`. TensorFlow
loads where data is first read (`vit_jax.config.imports.lazy`), so a
mistake in the flags or the config is said in about a second. Importing a
module changes no environment.

`run(main)` replaces `absl.app.run`. A mistake of the user's making (a bad
flag or config value, a missing file, a refused checkpoint: a `UserError`)
prints `error: ...` on stderr and exits with status 2, without a traceback;
`--verbose` (or VIT_JAX_VERBOSE=1) shows it. A storage error that may pass
(a reset connection, a timeout) prints the same line and exits with 75
(EX_TEMPFAIL: worth a retry). Any other exception is a bug
and keeps its traceback. The console shows our own lines
(`vit_jax.console`), warnings and errors; `--log_level=info` (or
`--verbose`) brings back every INFO line of ours and of the libraries.
"""

import gc
import glob
import importlib
import importlib.util
import os
import re
import sys
import traceback

from absl import app
from absl import flags
from absl import logging
import jax

from vit_jax import liveness
from vit_jax import paths
from vit_jax.config import imports
from vit_jax.errors import UserError


def _verbose_by_environment() -> bool:
  return os.environ.get("VIT_JAX_VERBOSE", "") not in ("", "0")


# Subcommand -> (module in vit_jax/commands, what it does). `vit-jax NAME`
# and `python -m vit_jax NAME` run the module.
COMMANDS = {
    "train": ("train", "pre-train or fine-tune (the main job)"),
    "fewshot": ("fewshot", "few-shot sweeps of checkpoints"),
    "inspect": ("inspect_weights", "what a weights file holds; a load report"),
    "export": ("export", "weights for timm, transformers, released .npz"),
    "plan": ("plan", "memory and fit of a config on a topology"),
    "benchmark": ("benchmark", "train-step images/s and MFU"),
    "benchmark-input": ("benchmark_input", "input pipeline images/s"),
    "convert-data": ("convert_data", "a TFRecord dataset as ArrayRecord"),
    "predict": ("predict", "top classes of image files"),
    "zeroshot": ("zeroshot", "an image-text model's zero-shot accuracy"),
    "analyze": ("analyze", "the paper's figures of what a model learnt"),
    "vtab": ("vtab", "fine-tune a checkpoint on the 19 VTAB-1k tasks"),
}
FLAGS = flags.FLAGS
flags.DEFINE_bool(
    "verbose", False,
    "Show the traceback of errors in the input too, and every "
    "INFO line (as --log_level=info).")
flags.DEFINE_enum(
    "log_level", "warning", ["debug", "info", "warning", "error"],
    "Library and detail log lines shown; ours (steps, "
    "evaluations, checkpoints) are always shown.")
flags.DEFINE_bool("distributed", False,
                  "Join a multi-process run (jax.distributed.initialize).")
flags.DEFINE_string("coordinator_address", None,
                    "HOST:PORT of process 0; implies --distributed.")
flags.DEFINE_integer("num_processes", None, "Processes in the run.",
                     lower_bound=1)
flags.DEFINE_integer("process_id", None, "This process's index.", lower_bound=0)
flags.DEFINE_float(
    "lost_process_timeout", 60,
    "Seconds without a heartbeat after which a multi-process run stops, "
    "naming the lost process (vit_jax/liveness.py).")
flags.DEFINE_bool(
    "offline", False, "Download no checkpoints: URLs and released names load "
    "only from the cache (config.init.cache_dir). Sets "
    "VIT_JAX_OFFLINE=1, which this process and the ones it "
    "starts read.")


def check_flag(name: str, ok, fix: str):
  """A value of --NAME that `ok` refuses stops the command before it starts,
  with one line: `error: flag --NAME=VALUE: FIX` (exit 2). Unset (None)
  passes. Plain bounds are the flag's lower_bound/upper_bound instead."""
  flags.register_validator(name, lambda value: value is None or ok(value),
                           message=fix)


check_flag("lost_process_timeout", lambda seconds: seconds > 0,
           "give a positive number of seconds (60 by default).")
flags.register_multi_flags_validator(
    ["process_id", "num_processes"],
    lambda f: None in f.values() or f["process_id"] < f["num_processes"],
    "--process_id counts from 0: give one below --num_processes.")

# OSError: a missing file, a config file that failed to load, storage that
# cannot be reached.
USER_ERRORS = (UserError, OSError, app.UsageError)
# Of those, the ones a retry meets again (exit status 2). Other OSErrors (a
# reset connection, storage that timed out) may pass: they exit with 75,
# EX_TEMPFAIL, which a scheduler may retry (launch/gke.py's JobSet does).
MISTAKES = (UserError, app.UsageError, FileNotFoundError, FileExistsError,
            IsADirectoryError, NotADirectoryError, PermissionError)
TEMPORARY_FAILURE = 75


def exit_status(error: BaseException) -> int:
  return 2 if isinstance(error, MISTAKES) else TEMPORARY_FAILURE


def define_checkpoint_flags(use: str):
  """--checkpoint (required), --config, --image_size and --num_heads: the
  flags of commands that apply one checkpoint (`inference.load` reads
  them)."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string(
      "checkpoint", None, f"Weights {use} (any format, "
      "URL or released name, e.g. ViT-B/16@i21k, that "
      "config.init.checkpoint reads).")
  config_flags.DEFINE_config_file(
      "config", None, "Config of the model and its preprocessing "
      "(FILE.py:ARG); default: the workdir's config.json, or read from the "
      "file.", lock_config=True)
  flags.DEFINE_integer(
      "image_size", None, "Resolution (default: the "
      "checkpoint's); position embeddings are resized.", lower_bound=1)
  flags.DEFINE_integer(
      "num_heads", None, "Attention heads; only for PyTorch files of a width "
      "no variant has.", lower_bound=1)
  flags.mark_flags_as_required(["checkpoint"])


def initialize_distributed():
  """Starts JAX's multi-process runtime when asked to (before any JAX use).

  TPU pods, SLURM and Open MPI are detected by `jax.distributed.initialize`;
  elsewhere pass --coordinator_address, --num_processes and --process_id.
  """
  if not (FLAGS.distributed or FLAGS.coordinator_address or
          os.environ.get("JAX_COORDINATOR_ADDRESS")):
    return
  jax.distributed.initialize(
      coordinator_address=FLAGS.coordinator_address,
      num_processes=FLAGS.num_processes, process_id=FLAGS.process_id,
      heartbeat_timeout_seconds=liveness.jax_heartbeat_timeout(
          FLAGS.lost_process_timeout))
  liveness.start(FLAGS.lost_process_timeout)
  logging.info("Process %d of %d; %d local of %d devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(),
               jax.device_count())
  if jax.process_index() > 0:  # One log for the run: process 0's.
    logging.set_verbosity(logging.WARNING)


def _verbose() -> bool:
  return (_verbose_by_environment() or FLAGS.is_parsed() and FLAGS.verbose or
          "--verbose" in sys.argv)


def _set_log_level():
  level = FLAGS.log_level
  logging.set_verbosity("info" if _verbose() and level != "debug" else level)


_EXCEPTION_NAME = re.compile(r"^[A-Za-z_][\w.]*: ")  # "pkg.SomeError: ".


def _message(error) -> str:
  """The error's own words, without a traceback a config loader embedded."""
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]  # ml_collections wraps a KeyError in others.
  text = str(error.args[0] if isinstance(error, KeyError) and error.args else
             error).strip() or type(error).__name__
  if "Traceback (most recent call last)" in text:
    where = text.split(": Error whilst parsing config file")[0]
    last = [line for line in text.splitlines() if line.strip()][-1]
    text = f"{where}: {_EXCEPTION_NAME.sub('', last)}"
  return text


def _fail(error, status: int = 2):
  """`error: FIRST LINE` (details, such as a load report, indented below)."""
  text = error if isinstance(error, str) else _message(error)
  first, *rest = text.splitlines()
  # One write: a line printed in two parts can be split by another thread's.
  sys.stderr.write("\n".join([f"error: {first}"] +
                             [f"  {line}" for line in rest]) + "\n")
  sys.stderr.flush()
  if liveness.active():  # The other processes stop too, naming this one.
    liveness.fail_and_exit(f"error: {first}", status)
  sys.exit(status)


def _parse_flags(argv):
  try:
    return FLAGS(argv)
  except (flags.Error, ValueError) as e:  # Also a config file's own error.
    if _verbose():
      raise
    _fail(e)
  except (AttributeError, KeyError) as e:  # A misspelt --config.FIELD.
    if _verbose():
      raise
    _fail("the config has no field " +
          "; ".join(line.strip() for line in _message(e).splitlines()))


def skip_absent_tpu():
  """With libtpu installed (the `tpu` extra, also used to plan TPU jobs from
  a CPU host) but no TPU chips, JAX would start libtpu, which logs errors
  before JAX falls back; leave it out unless JAX_PLATFORMS says otherwise.
  TPU VMs expose their chips as /dev/accel* or /dev/vfio/N."""
  if ("JAX_PLATFORMS" in os.environ or
      importlib.util.find_spec("libtpu") is None or glob.glob("/dev/accel*") or
      glob.glob("/dev/vfio/[0-9]*")):
    return
  cuda = any(
      importlib.util.find_spec(f"jax_cuda{version}_plugin") is not None
      for version in (12, 13))  # The `cuda` / `cuda12` and `cuda13` extras.
  jax.config.update("jax_platforms", "cuda,cpu" if cuda else "cpu")


def run(main):
  """`absl.app.run(main)` with the error policy of the module doc."""

  def guarded(argv):
    _set_log_level()
    skip_absent_tpu()
    paths.configure_storage()
    if FLAGS.offline:
      os.environ["VIT_JAX_OFFLINE"] = "1"  # See vit_jax/weights/files/cache.py.
    mistake = None  # (what to say, exit status)
    try:
      if "config" in FLAGS and FLAGS.config is not None:
        imports.load(FLAGS.config)  # Before the command reads the config.
      result = main(argv)
    except USER_ERRORS as e:
      if _verbose():
        raise
      mistake = (_message(e), exit_status(e))
    except Exception as e:  # A bug, or a collective a lost process broke.
      if isinstance(e, jax.errors.JaxRuntimeError):
        liveness.await_verdict()  # A lost process ends this one with a line.
      if not liveness.active():
        raise
      traceback.print_exc()
      first = (str(e).strip().splitlines() or [""])[0][:300]
      liveness.fail_and_exit(f"{type(e).__name__}: {first}", 1)
    if mistake is not None:
      # Said out here, not in the except clause, where the exit would keep
      # the error, whose traceback holds the failed run's frames and what
      # they started (input pipelines, whose threads may run Python), until
      # interpreter exit, when those threads can no longer finish.
      gc.collect()  # The frames' reference cycles too.
      _fail(*mistake)
    liveness.finish()
    if jax.distributed.is_initialized():
      # Leave the multi-process runtime together, before interpreter
      # teardown: a process still exiting when process 0 takes the
      # coordination service down aborts (SIGABRT).
      jax.distributed.shutdown()
    return result

  app.run(guarded, flags_parser=_parse_flags)


def dispatch():
  """`vit-jax NAME [flags]`: runs the command `NAME` (see COMMANDS)."""
  name = sys.argv[1] if len(sys.argv) > 1 else ""
  if name not in COMMANDS:
    width = max(map(len, COMMANDS))
    listing = "\n".join(
        f"  {n:<{width}}  {what}" for n, (_, what) in COMMANDS.items())
    print(
        f"usage: vit-jax COMMAND [flags]   (vit-jax COMMAND --help)\n\n"
        f"commands:\n{listing}", file=sys.stderr)
    sys.exit(0 if name in ("-h", "--help", "help") else 2)
  module_name, _ = COMMANDS[name]
  sys.argv = [f"vit-jax {name}"] + sys.argv[2:]
  command = importlib.import_module(f"vit_jax.commands.{module_name}")
  sys.modules["__main__"].__doc__ = command.__doc__  # What --help shows.
  run(command.main)
