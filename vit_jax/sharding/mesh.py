"""The device mesh, batches split over it, and functions jitted on it.

The mesh has a `data` axis (batch, and FSDP) and a `model` axis (tensor
parallelism). On several TPU slices (joined by the data-centre network,
DCN, far slower than the chips' own ICI links) it has a leading `slice`
axis too: the batch is split over `slice` and `data`, while FSDP and
tensor parallelism stay inside a slice, so the only traffic between slices
is the gradients' all-reduce, once a step (`make_mesh`). Batches are sharded
over the data axes (`batch_axes`). Activations carry logical axis names
(`models/partitioning.py`), mapped to the mesh by the config's rules inside
jitted functions run through `jit_on_mesh`.
"""

import contextlib
from typing import Callable
from typing import Optional

from absl import logging
import flax.linen as nn
import jax
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from vit_jax import hardware
from vit_jax.errors import UserError

SLICE_AXIS = "slice"
DATA_AXIS = "data"
MODEL_AXIS = "model"


def make_mesh(data: int = -1, model: int = 1, devices=None, slices: int = -1,
              fsdp_over_slices: bool = False) -> Mesh:
  """A (data, model) mesh over all devices; -1 means 'the rest'.

  On several slices (`slices`; -1: as many as the devices' `slice_index`
  name), a (slice, data, model) mesh: `data` and `model` lay out each
  slice's devices as on one slice, and `slice` goes across them. With
  `fsdp_over_slices`, the slices are stacked along `data` instead (a
  (data, model) mesh, `data` slice-major), so FSDP splits parameters over
  every device and gathers them over DCN too.
  """
  devices = jax.devices() if devices is None else list(devices)
  groups = slice_groups(devices, slices)
  if len(groups) == 1:
    return _one_slice_mesh(data, model, devices)
  per_slice = [_one_slice_mesh(data, model, g).devices for g in groups]
  if fsdp_over_slices:
    return Mesh(np.concatenate(per_slice), (DATA_AXIS, MODEL_AXIS),
                axis_types=(AxisType.Auto,) * 2)
  return Mesh(np.stack(per_slice), (SLICE_AXIS, DATA_AXIS, MODEL_AXIS),
              axis_types=(AxisType.Auto,) * 3)


def slice_groups(devices, slices: int = -1) -> list[list]:
  """The devices of each slice, in slice order.

  Devices carry their slice in `slice_index` (TPUs; one slice where it is
  missing). `slices=-1` takes those; N on devices of one slice splits them
  into N groups of whole processes (or, in one process, of consecutive
  devices): several processes on CPUs stand for slices in tests.
  """
  if slices == 0 or slices < -1:
    raise UserError(f"config.mesh.slices={slices}: give the number of "
                    "slices, or -1 for the devices' own.")
  index = lambda d: getattr(d, "slice_index", None) or 0
  named = sorted({index(d) for d in devices})
  if slices == -1 or slices == len(named):
    return [[d for d in devices if index(d) == i] for i in named]
  if len(named) > 1:
    raise UserError(
        f"config.mesh.slices={slices}, but the {len(devices)} devices lie on "
        f"{len(named)} slice{'s' if len(named) > 1 else ''}; set "
        "config.mesh.slices=-1 (the devices' own slices).")
  processes = sorted({d.process_index for d in devices})
  if len(processes) > 1:
    if len(processes) % slices:
      raise UserError(
          f"config.mesh.slices={slices} does not divide the "
          f"{len(processes)} processes; use a divisor of {len(processes)} "
          "or -1.")
    per = len(processes) // slices
    return [[d
             for d in devices
             if d.process_index in processes[i:i + per]]
            for i in range(0, len(processes), per)]
  if len(devices) % slices:
    raise UserError(f"config.mesh.slices={slices} does not divide the "
                    f"device count, {len(devices)}; use a divisor of it or "
                    "-1.")
  per = len(devices) // slices
  return [devices[i:i + per] for i in range(0, len(devices), per)]


def _one_slice_mesh(data: int, model: int, devices) -> Mesh:
  count = len(devices)
  sizes = {DATA_AXIS: data, MODEL_AXIS: model}
  known = int(np.prod([s for s in sizes.values() if s != -1]))
  if (list(sizes.values()).count(-1) > 1 or known < 1 or count % known or
      any(s == 0 or s < -1 for s in sizes.values())):
    raise UserError(f"Mesh {sizes} does not fit {count} devices: the product "
                    "of the fixed sizes must divide the device count, and at "
                    "most one axis may be -1 (set config.mesh.data and "
                    "config.mesh.model).")
  sizes = {k: (count // known if s == -1 else s) for k, s in sizes.items()}
  if int(np.prod(list(sizes.values()))) != count:
    raise UserError(f"Mesh {sizes} uses {np.prod(list(sizes.values()))} "
                    f"devices but there are {count}; set one axis of "
                    "config.mesh to -1.")
  # Auto axes: the compiler propagates shardings from the annotated inputs.
  return jax.make_mesh(tuple(
      sizes.values()), tuple(sizes), axis_types=(AxisType.Auto,) * len(sizes),
                       devices=devices)


def mesh_from_config(config: ml_collections.ConfigDict, devices=None) -> Mesh:
  return make_mesh(config.mesh.data, config.mesh.model, devices,
                   config.mesh.slices, config.mesh.fsdp_over_slices)


def batch_axes(mesh: Mesh):
  """The mesh axes the batch is split over: `data`, or (`slice`, `data`)."""
  return (SLICE_AXIS, DATA_AXIS) if SLICE_AXIS in mesh.shape else DATA_AXIS


def data_shards(mesh: Mesh) -> int:
  """Into how many shards the batch is split (`batch_axes`' devices)."""
  return int(mesh.shape[DATA_AXIS] * mesh.shape.get(SLICE_AXIS, 1))


def rules_on_mesh(rules, mesh: Mesh) -> tuple:
  """Logical-axis rules with the batch's `data` read as `batch_axes`."""
  axes = batch_axes(mesh)
  return tuple(
      (name, axes if axis == DATA_AXIS else axis) for name, axis in rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(batch_axes(mesh)))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def local_batch_size(global_batch: int, mesh: Optional[Mesh] = None, *,
                     what: str = "batch_size", accumulation: int = 1,
                     process_count: Optional[int] = None,
                     log: bool = False) -> int:
  """This process's share of `global_batch` (`config.{what}`), checked.

  The batch must split over the processes and, given the mesh, over its
  data shards into `accumulation` micro-batches each. With `log`, says the
  global, per-process and per-device sizes in one line.
  """
  processes = jax.process_count() if process_count is None else process_count
  if mesh is not None:
    shards = data_shards(mesh)
    if global_batch % shards:
      raise UserError(
          f"config.{what}={global_batch} is not divisible by the {shards} "
          f"data shards of the mesh; use a multiple of {shards}.")
    if accumulation < 1 or global_batch % (accumulation * shards):
      raise UserError(
          f"config.{what}={global_batch} does not split into accum_steps="
          f"{accumulation} micro-batches over {shards} data shards; use a "
          f"multiple of {max(accumulation, 1) * shards}.")
  if global_batch % processes:
    raise UserError(f"config.{what}={global_batch} is not divisible by the "
                    f"{processes} processes; use a multiple of {processes}.")
  local = global_batch // processes
  if log:
    sizes = f"{global_batch} global, {local} per process ({processes})"
    if mesh is not None:
      per_device = global_batch // data_shards(mesh)
      sizes += (f", {per_device} per device ({data_shards(mesh)} data "
                "shards)")
      if accumulation > 1:
        sizes += (f", {per_device // accumulation} per device and micro-batch"
                  f" ({accumulation} accumulation steps)")
    logging.info("config.%s: %s.", what, sizes)
  return local


def to_global_batch(local_batch, mesh: Mesh):
  """Process-local numpy batch -> global jax.Arrays sharded over `data`."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, x),
      local_batch)


class jit_on_mesh:  # pylint: disable=invalid-name
  """`jax.jit` whose tracing sees the mesh and the logical-axis rules.

  The model's `nn.with_logical_constraint` annotations turn into sharding
  constraints only when traced under both (`jax.set_mesh` must be entered
  outside jit, hence this wrapper around every call). `compile` makes the
  executable ahead of the first call (to inspect its memory); a call with
  arguments of that structure, shapes and dtypes runs it, any other (a
  step at another sequence length) jit's own.
  """

  def __init__(self, fn: Callable, mesh: Mesh, logical_axis_rules, **jit_kw):
    # XLA's options of this backend (ours on a CPU: `hardware`).
    self._jitted = jax.jit(fn, compiler_options=hardware.compiler_options() or
                           None, **jit_kw)
    self._mesh = mesh
    self._rules = rules_on_mesh(logical_axis_rules, mesh)
    self._compiled = None
    self._compiled_for = None  # `_signature` of what it was compiled for.

  @contextlib.contextmanager
  def _context(self):
    with jax.set_mesh(self._mesh), nn.logical_axis_rules(self._rules):
      yield

  def __call__(self, *args):
    if self._compiled is not None and _signature(args) == self._compiled_for:
      return self._compiled(*args)
    with self._context():
      return self._jitted(*args)

  def lower(self, *args):
    with self._context():
      return self._jitted.lower(*args)

  def compile(self, *args):
    """Compiles for these arguments' shapes and shardings ahead of the first
    call; later calls with arguments of the same shapes run it."""
    self._compiled = self.lower(*args).compile()
    self._compiled_for = _signature(args)
    return self._compiled


def _signature(args) -> tuple:
  """What an ahead-of-time executable is specialised to: the arguments'
  tree structure and each leaf's shape and dtype."""
  leaves, treedef = jax.tree.flatten(args)
  return treedef, tuple(
      (np.shape(x), getattr(x, "dtype", type(x))) for x in leaves)
