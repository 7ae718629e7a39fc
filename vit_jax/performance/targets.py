"""The devices a plan compiles for: a TPU topology that libtpu describes
(no TPU needed), or this host's CPU devices, and how they lie on chips.

libtpu names a topology GENERATION:CHIPS, e.g. `v3:4x4` (a v3-32: 16 chips,
32 devices) or `tpu7x:2x2x1`; which generations and shapes exist is its to
say, and a name it does not know gets one line listing those it does.
"""

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
import re

import jax

from vit_jax import hardware
from vit_jax.errors import UserError

# libtpu describes a v4 by its two cores, but JAX lays out meshes on a v4
# only as one device per chip (megacore), as v4 TPU VMs run: such a device
# is planned as its chip, its first core standing for both.
MEGACORE_ONLY = ("TPU v4",)
# Generations tried when a name is refused, to list those this libtpu knows.
_GENERATIONS = ("v2", "v3", "v4", "v5e", "v5p", "v6e", "tpu7x")


def cpu_device_count(topology: str) -> int:
  """N of 'cpu:N', a whole number of at least 1 (else a clear error)."""
  count = topology[4:]
  if not re.fullmatch(r"[0-9]+", count) or int(count) < 1:
    raise UserError(f"--topology={topology!r}: cpu:N needs N, the number of "
                    "host devices to plan for, to be a whole number of at "
                    "least 1, e.g. cpu:8.")
  return int(count)


def target_devices(topology: str, slices: int = 1) -> list:
  """The devices of a TPU topology like 'v5e:4x4' or 'v3:4x4' (described
  by libtpu, no TPU needed; `slices` of it, joined by DCN), or of 'cpu:N'."""
  _check_slices(slices)
  if topology.startswith("cpu:"):
    if slices > 1:  # CPU devices name no slice; the mesh splits them.
      raise UserError(f"--slices={slices} is for TPU topologies; for "
                      f"{topology}, set --config.mesh.slices={slices} to "
                      "split its devices into slices.")
    count = cpu_device_count(topology)
    if jax.device_count() < count:
      raise UserError(
          f"--topology={topology} needs {count} CPU devices and JAX has "
          f"{jax.device_count()}; start a new process for it (the plan "
          "command sets them up itself).")
    return jax.devices()[:count]
  not_a_name = lambda: UserError(
      f"--topology={topology!r} is not GENERATION:AxB or GENERATION:AxBxC "
      f"(chips along each axis), or cpu:N; {_known_generations()}.")
  if not topology.strip():  # libtpu would describe a default slice.
    raise not_a_name()
  try:
    devices = list(_describe(topology, slices))
  except UserError:
    raise
  except Exception as e:  # noqa: BLE001 libtpu says why in its message.
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "Invalid TPU external name" in why:
      generation = re.split(r"[:_=]", topology)[0]
      raise UserError(f"--topology={topology!r}: libtpu knows no TPU "
                      f"generation {generation!r}; "
                      f"{_known_generations()}.") from e
    if "does not match" in why:  # Not GENERATION:AxB[xC] at all.
      raise not_a_name() from e
    raise UserError(f"--topology={topology!r}: libtpu cannot describe it "
                    f"({why}).") from e
  if devices[0].device_kind in MEGACORE_ONLY:
    devices = [d for d in devices if d.core_on_chip == 0]
  return devices


def _check_slices(slices: int):
  if slices < 1:
    raise UserError(f"--slices={slices}: give the number of slices of the "
                    "topology, a whole number of at least 1.")


def _describe(topology: str, slices: int = 1):
  if importlib.util.find_spec("libtpu") is None:
    raise UserError(f"--topology={topology}: describing a TPU topology needs "
                    "libtpu: pip install -e '.[tpu]'.")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # No TPU to look for.
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-16")
  # Only compiling: several plans (or tests) may load libtpu at once.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  return topologies.get_topology_desc(topology_name=topology, platform="tpu",
                                      num_slices=slices).devices


@contextlib.contextmanager
def compiling_for(devices):
  """Around the compilation of a plan: for compile-only TPU devices, none of
  its programs is written to JAX's persistent compilation cache, as a
  client without a TPU cannot read one back ('PjRtCompiler must be
  constructed with a Client')."""
  if devices[0].platform == "cpu":
    yield
    return
  option = "jax_persistent_cache_min_compile_time_secs"
  saved = getattr(jax.config, option)
  jax.config.update(option, float("inf"))
  try:
    yield
  finally:
    jax.config.update(option, saved)


def _known_generations() -> str:
  """The generations this libtpu describes (asked with a 2x2x1 slice)."""
  if importlib.util.find_spec("libtpu") is None:
    return "TPU topologies need libtpu: pip install -e '.[tpu]'"
  known = []
  for generation in _GENERATIONS:
    try:
      _describe(f"{generation}:2x2x1")
      known.append(generation)
    except Exception:  # noqa: BLE001, S112 Not known to this libtpu.
      continue
  try:
    version = f"libtpu {importlib.metadata.version('libtpu')}"
  except importlib.metadata.PackageNotFoundError:  # Installed another way.
    version = "this libtpu"
  return (f"{version} knows "
          f"{', '.join(known) or 'none of ' + ', '.join(_GENERATIONS)} "
          "(e.g. v3:4x4, v5e:4x4, v5p:2x2x4, tpu7x:2x2x1)")


def target(topology: str, slices: int = 1) -> tuple[list, hardware.Placement]:
  """(devices, how they lie on chips and hosts) of `slices` x `topology`
  (chips and hosts counted over all of them)."""
  devices = target_devices(topology, slices)
  placed = hardware.placement(devices)
  if devices[0].device_kind in MEGACORE_ONLY:  # Each stands for its chip.
    placed = dataclasses.replace(placed, cores_per_chip=2)
  return devices, placed
