"""The user's own modules a config names (`config.imports`), loaded before the
config is checked or used: they register preprocessing ops
(`vit_jax.data.preprocess.register`) and evaluator types
(`vit_jax.evaluators.register`), so a project is extended without editing
the package. An entry is a module name importable from `sys.path`, or the
path of a `.py` file (relative to the working directory, made absolute in
the config so the run's config.json finds it from anywhere; a config file
can name one beside itself with `os.path.dirname(__file__)`). Each is
loaded once per process.

Also the libraries that cost seconds to import and that checking a config
does not need (TensorFlow, TFDS and clu's writers, which only reading data
needs; Orbax): modules take them from `lazy`, so they load where they are
first used, and a mistake in a config is found before, in about a second.
"""

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import types

import ml_collections

from vit_jax.errors import UserError

_LOADED: dict[str, object] = {}
# The packages that load TensorFlow.
_WITH_TENSORFLOW = ("tensorflow", "tensorflow_datasets", "clu")


def _load_tensorflow():
  """TensorFlow 2.21 prints a oneDNN notice from C++ while it loads, which no
  log level silences once JAX is loaded: it loads with stderr closed, unless
  every C++ line is asked for (TF_CPP_MIN_LOG_LEVEL=0, as `--verbose` sets).
  Without TensorFlow this does nothing; a broken install fails again, with
  its messages, where it is next imported."""
  if ("tensorflow" in sys.modules or
      os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0" or
      importlib.util.find_spec("tensorflow") is None):
    return
  saved = os.dup(2)
  try:
    with open(os.devnull, "w") as devnull:
      os.dup2(devnull.fileno(), 2)
      with contextlib.suppress(ImportError):
        importlib.import_module("tensorflow")
  finally:
    os.dup2(saved, 2)
    os.close(saved)


def import_quietly(name: str) -> types.ModuleType:
  """`importlib.import_module(name)`; TensorFlow first (`_load_tensorflow`)
  where `name` loads it."""
  if name.split(".")[0] in _WITH_TENSORFLOW:
    _load_tensorflow()
  return importlib.import_module(name)


class _Lazy:
  """Module `name`, imported (`import_quietly`) at the first use of one of
  its attributes."""

  def __init__(self, name: str):
    self._name = name

  def __getattr__(self, attribute: str):
    return getattr(import_quietly(self._name), attribute)

  def __repr__(self):
    return f"<module {self._name!r}, imported at first use>"


def lazy(name: str):
  """Module `name` (e.g. "tensorflow"), imported where it is first used."""
  return _Lazy(name)


def _load_file(path: str):
  """The module of an absolute path, named after it (two files of the same
  basename are two modules)."""
  digest = hashlib.sha256(path.encode()).hexdigest()[:8]
  base = os.path.splitext(os.path.basename(path))[0]
  name = f"vit_jax_user_{base}_{digest}"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]  # A retry loads it afresh.
    raise
  return module


def _import(name: str):
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name is not None and name != e.name and not name.startswith(e.name +
                                                                     "."):
      raise UserError(f"config.imports names the module {name!r}, which "
                      f"imports {e.name!r}, not installed ({e}); install "
                      "it.") from e
    raise UserError(f"config.imports names the module {name!r}, which "
                    f"cannot be imported ({e}); put it on PYTHONPATH or "
                    "give the path of its .py file.") from e


def load(config: ml_collections.ConfigDict) -> None:
  """Imports every module of `config.imports` not imported yet; makes the
  paths of .py files absolute in the config."""
  entries = []
  for entry in config.imports:
    if entry.endswith(".py"):
      entry = os.path.abspath(entry)
      if not os.path.isfile(entry):
        raise UserError(f"config.imports names {entry!r}, which is not a "
                        "file; give the path of a .py file or a module name.")
    entries.append(entry)
    if entry not in _LOADED:
      _load_tensorflow()  # Where the user's modules import it.
      _LOADED[entry] = (_load_file(entry)
                        if entry.endswith(".py") else _import(entry))
  if tuple(entries) != tuple(config.imports):
    config.imports = tuple(entries)
