"""The user's own modules a config names (`config.imports`), loaded before the
config is checked or used: they register preprocessing ops
(`vit_jax.data.preprocess.register`) and evaluator types
(`vit_jax.evaluators.register`), so a project is extended without editing
the package. An entry is a module name importable from `sys.path`, or the
path of a `.py` file (relative to the working directory; a config file can
name one beside itself with `os.path.dirname(__file__)`). Each is loaded
once per process.
"""

import importlib
import importlib.util
import os
import sys

import ml_collections

from vit_jax.errors import UserError

_LOADED: dict[str, object] = {}


def _load_file(path: str):
  name = "vit_jax_user_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def load(config: ml_collections.ConfigDict) -> None:
  """Imports every module of `config.imports` not imported yet."""
  for entry in config.imports:
    key = os.path.abspath(entry) if entry.endswith(".py") else entry
    if key in _LOADED:
      continue
    if entry.endswith(".py"):
      if not os.path.isfile(key):
        raise UserError(f"config.imports names {entry!r}, which is not a "
                        "file; give the path of a .py file or a module name.")
      _LOADED[key] = _load_file(key)
    else:
      try:
        _LOADED[key] = importlib.import_module(entry)
      except ModuleNotFoundError as e:
        raise UserError(f"config.imports names the module {entry!r}, which "
                        f"cannot be imported ({e}); put it on PYTHONPATH or "
                        "give the path of its .py file.") from e
