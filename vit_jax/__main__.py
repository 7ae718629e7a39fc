"""`vit-jax NAME [flags]` (the installed script) and `python -m vit_jax NAME
[flags]`: sets up the process, then `cli.dispatch` runs the command.

The set-up comes first, before anything imports JAX or TensorFlow (`cli`
imports JAX), so that importing a module of the package changes no
environment: TF_CPP_MIN_LOG_LEVEL, the C++ log level of TensorFlow and of
JAX's XLA, is read when they first log, and JAX sets its own default (1,
warnings shown) when it is imported.
"""

import os
import re
import sys


def detail_requested() -> bool:
  """--verbose, --log_level=info/debug or VIT_JAX_VERBOSE=1, read before the
  flags are parsed (the libraries log while they load)."""
  return os.environ.get("VIT_JAX_VERBOSE", "") not in ("", "0") or any(
      a == "--verbose" or re.fullmatch(r"--log_level=(info|debug)", a)
      for a in sys.argv[1:])


def main():
  details = detail_requested()
  # TensorFlow's and XLA's C++ INFO and WARNING lines, unless asked for.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if details else "2")
  from vit_jax import cli  # pylint: disable=g-import-not-at-top
  cli.dispatch()


if __name__ == "__main__":
  main()
