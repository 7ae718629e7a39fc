"""The environment of the suite's processes: the test workers
(`tests/conftest.py`) and the commands they start (`command_env`).

XLA spends longer compiling most of the suite's tiny programs than
running them, so its CPU backend optimises them at LLVM's level 1, not the
default 2: they compile in about a tenth less CPU time, run as fast and
compute the same numbers. (Level 0 compiles in a third less, but runs the
digits model's steps half again as slowly.)
"""

import os

COMPILER_FLAGS = "--xla_backend_optimization_level=1"
# The suite's persistent compilation cache: one per clone, so a fresh clone
# is timed as a newcomer meets it (cold), and a second run reads it.
CACHE_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), ".jax_cache")


def xla_flags(devices: int = 8) -> str:
  """XLA_FLAGS with `devices` simulated CPU devices."""
  return (f"{COMPILER_FLAGS} "
          f"--xla_force_host_platform_device_count={devices}")


def command_env(devices: int = 1, **overrides: str) -> dict[str, str]:
  """This process's environment for a command the test starts: with
  `devices` CPU devices (1: as a user's machine has), and `overrides`."""
  return {**os.environ, "XLA_FLAGS": xla_flags(devices), **overrides}
