"""Device mesh and the shardings of batches and the train state.

The mesh has a `data` axis (batch) and a `model` axis; batches are sharded
over `data`, every parameter is replicated.
"""

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"
MODEL_AXIS = "model"


def make_mesh(data: int = -1, model: int = 1, devices=None) -> Mesh:
  """A (data, model) mesh over all devices; -1 means 'the rest'."""
  devices = jax.devices() if devices is None else devices
  count = len(devices)
  sizes = {DATA_AXIS: data, MODEL_AXIS: model}
  known = int(np.prod([s for s in sizes.values() if s != -1]))
  if list(sizes.values()).count(-1) > 1 or count % known:
    raise ValueError(f"Mesh {sizes} does not fit {count} devices: the product "
                     "of the fixed sizes must divide the device count, and at "
                     "most one axis may be -1.")
  sizes = {k: (count // known if s == -1 else s) for k, s in sizes.items()}
  if int(np.prod(list(sizes.values()))) != count:
    raise ValueError(f"Mesh {sizes} uses {np.prod(list(sizes.values()))} "
                     f"devices but there are {count}; set one axis to -1.")
  # Auto axes: the compiler propagates shardings from the annotated inputs.
  return jax.make_mesh(tuple(sizes.values()), tuple(sizes),
                       axis_types=(AxisType.Auto,) * len(sizes),
                       devices=devices)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch_size(batch_size: int, mesh: Mesh, what: str = "batch_size",
                     accum_steps: int = 1):
  shards = mesh.shape[DATA_AXIS]
  if batch_size % shards:
    raise ValueError(
        f"config.{what}={batch_size} is not divisible by the {shards} data "
        f"shards of the mesh; use a multiple of {shards}.")
  if accum_steps < 1 or batch_size % (accum_steps * shards):
    raise ValueError(
        f"config.{what}={batch_size} does not split into accum_steps="
        f"{accum_steps} micro-batches over {shards} data shards; use a "
        f"multiple of {max(accum_steps, 1) * shards}.")


def to_global_batch(local_batch, mesh: Mesh):
  """Process-local numpy batch -> global jax.Arrays sharded over `data`."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, x),
      local_batch)
