"""Device mesh, and how batches, parameters and optimizer state lie on it.

The mesh has a `data` axis (batch, and FSDP) and a `model` axis (tensor
parallelism). On several TPU slices (joined by the data-centre network,
DCN, far slower than the chips' own ICI links) it has a leading `slice`
axis too: the batch is split over `slice` and `data`, while FSDP and
tensor parallelism stay inside a slice, so the only traffic between slices
is the gradients' all-reduce, once a step (`make_mesh`). Batches are sharded
over the data axes (`batch_axes`). Each parameter gets the strategy of the
first `config.sharding.params` rule whose regex matches its '/'-joined
path:

  replicate  a full copy on every device;
  fsdp       its largest dimension divisible by the `data` axis is split
             over it (parameters under `fsdp_min_size` elements stay whole);
  tp         its logical axes (`models/partitioning.py`: attention heads,
             MLP hidden units) split over the mesh axes that
             `config.sharding.logical_axis_rules` names;
  fsdp+tp    both (fsdp takes the largest dimension tp left free).

Optimizer-state leaves follow the parameter they mirror. Activations carry
the same logical names, mapped by the same rules inside jitted functions run
through `jit_on_mesh`.
"""

import contextlib
import re
from typing import Any
from typing import Callable
from typing import Optional
from typing import Sequence

from absl import logging
import flax
import flax.linen as nn
import jax
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.models import partitioning

SLICE_AXIS = "slice"
DATA_AXIS = "data"
MODEL_AXIS = "model"
STRATEGIES = ("replicate", "fsdp", "tp", "fsdp+tp")


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


def check_strategy_rules(rules: Sequence[tuple[str, str]]):
  """Config-time check of `config.sharding.params` (no parameters needed)."""
  for rule in rules:
    if len(rule) != 2 or rule[1] not in STRATEGIES:
      raise UserError(
          f"config.sharding.params rule {rule!r} must be a pair (regex, "
          f"strategy) with strategy one of {', '.join(STRATEGIES)}.")
    re.compile(rule[0])


def _logical_to_mesh(rules) -> dict[str, str]:
  return {logical: mesh_axis for logical, mesh_axis in rules}


def param_partition_specs(abstract_params, mesh: Mesh,
                          sharding_config: ml_collections.ConfigDict):
  """A PartitionSpec per parameter from the config's rules (see module doc)."""
  rules = list(sharding_config.params)
  check_strategy_rules(rules)
  flat = flax.traverse_util.flatten_dict(abstract_params, sep="/")
  used = set()
  logical = _logical_to_mesh(sharding_config.logical_axis_rules)
  specs = {}
  for path, leaf in flat.items():
    index = next(
        (i for i, (regex, _) in enumerate(rules) if re.fullmatch(regex, path)),
        None)
    if index is None:
      raise UserError(
          f"Parameter {path} matches no rule of config.sharding.params "
          f"{rules}; add a catch-all rule such as ('.*', 'replicate').")
    used.add(index)
    specs[path] = _spec_for(path, leaf.shape, rules[index][1], mesh, logical,
                            sharding_config.fsdp_min_size)
  unused = [rules[i] for i in range(len(rules)) if i not in used]
  if unused:
    raise UserError(
        f"config.sharding.params rules {unused} match no parameter (names "
        f"look like {next(iter(flat))!r}); fix or remove them.")
  return flax.traverse_util.unflatten_dict(specs, sep="/")


def _spec_for(path: str, shape, strategy: str, mesh: Mesh,
              logical: dict[str, str], fsdp_min_size: int) -> P:
  spec: list[Any] = [None] * len(shape)
  if "tp" in strategy:
    names = partitioning.param_logical_axes(path, len(shape))
    for dim, name in enumerate(names):
      axis = logical.get(name)
      if axis is None or axis == DATA_AXIS or mesh.shape[axis] == 1:
        continue
      if shape[dim] % mesh.shape[axis]:
        raise UserError(
            f"Tensor parallelism splits dimension {dim} ({name}) of {path} "
            f"with shape {tuple(shape)} over the {mesh.shape[axis]} devices "
            f"of mesh axis {axis!r}, which does not divide {shape[dim]}; "
            "choose another config.mesh.model or use 'fsdp' for it.")
      spec[dim] = axis
  data = mesh.shape[DATA_AXIS]
  # A scan slices its parameters' leading layer axis: never split that one.
  first = 1 if partitioning.is_scanned_block(path) else 0
  if "fsdp" in strategy and data > 1 and np.prod(shape) >= fsdp_min_size:
    free = [
        d for d in range(first, len(shape))
        if spec[d] is None and shape[d] % data == 0
    ]
    if free:
      spec[max(free, key=lambda d: (shape[d], -d))] = DATA_AXIS
  return P(*spec)


def replicate_all() -> ml_collections.ConfigDict:
  """The sharding config that replicates every parameter (a plain DP run)."""
  return ml_collections.ConfigDict(
      dict(params=((".*", "replicate"),), fsdp_min_size=0,
           logical_axis_rules=()))


def with_shardings(abstract, shardings):
  """ShapeDtypeStructs that carry their shardings (what `jit` lowers for
  devices that need not be attached)."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract,
      shardings)


def init_keys(key) -> tuple[jax.Array, jax.Array]:
  """(parameters' key, dropout's key) of a run's key: one rule, so random
  parameters (`random_params`) and a train state's start alike."""
  params_key, dropout_key = jax.random.split(key)
  return params_key, dropout_key


def random_params(model, image_size: int, seed: int, mesh: Mesh,
                  sharding_config=None):
  """The model's parameters at random init (`seed`), made in place on their
  shards (no host copy), and their shardings (`sharding_config`'s rules;
  default: all replicated)."""
  init, shardings = _params_init(model, image_size, mesh, sharding_config)
  return jax.jit(init, out_shardings=shardings)(jax.random.key(seed)), shardings


def abstract_params(model, image_size: int, mesh: Mesh, sharding_config=None):
  """(the parameters' ShapeDtypeStructs, their shardings), as
  `random_params` would make them: nothing is computed."""
  init, shardings = _params_init(model, image_size, mesh, sharding_config)
  return with_shardings(jax.eval_shape(init, jax.random.key(0)),
                        shardings), shardings


def _params_init(model, image_size: int, mesh: Mesh, sharding_config):
  init = lambda key: models.init_on_zeros(model, init_keys(key)[0], image_size)
  specs = param_partition_specs(jax.eval_shape(init, jax.random.key(0)), mesh,
                                sharding_config or replicate_all())
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                           is_leaf=lambda x: isinstance(x, P))
  return init, shardings


def state_shardings(abstract_state, abstract_params, param_specs, mesh: Mesh):
  """Shardings of the whole train state.

  Every leaf whose key path ends with a parameter's path and has its shape
  (params, EMA params, Adam moments, momentum) takes that parameter's spec;
  the rest (step, counts, RNG) is replicated.
  """
  specs = flax.traverse_util.flatten_dict(param_specs)
  by_path = {
      names: (tuple(leaf.shape), specs[names]) for names, leaf in
      flax.traverse_util.flatten_dict(abstract_params).items()
  }
  depths = sorted({len(k) for k in by_path})

  def leaf_sharding(key_path, leaf):
    names = partitioning.key_names(key_path)
    for depth in depths:
      match = by_path.get(names[-depth:])
      if match and match[0] == tuple(getattr(leaf, "shape", ())):
        return NamedSharding(mesh, match[1])
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(leaf_sharding, abstract_state)


class jit_on_mesh:  # pylint: disable=invalid-name
  """`jax.jit` whose tracing sees the mesh and the logical-axis rules.

  The model's `nn.with_logical_constraint` annotations turn into sharding
  constraints only when traced under both (`jax.set_mesh` must be entered
  outside jit, hence this wrapper around every call).
  """

  def __init__(self, fn: Callable, mesh: Mesh, logical_axis_rules, **jit_kw):
    self._jitted = jax.jit(fn, **jit_kw)
    self._mesh = mesh
    self._rules = rules_on_mesh(logical_axis_rules, mesh)
    self._compiled = None

  @contextlib.contextmanager
  def _context(self):
    with jax.set_mesh(self._mesh), nn.logical_axis_rules(self._rules):
      yield

  def __call__(self, *args):
    if self._compiled is not None:
      try:
        return self._compiled(*args)
      except TypeError:  # Other shapes (several sequence lengths): jit's.
        pass
    with self._context():
      return self._jitted(*args)

  def lower(self, *args):
    with self._context():
      return self._jitted.lower(*args)

  def compile(self, *args):
    """Compiles for these arguments' shapes and shardings ahead of the first
    call (to inspect its memory); later calls run this executable."""
    self._compiled = self.lower(*args).compile()
    return self._compiled


def splits_over_data(shardings) -> bool:
  """Whether any parameter is split over `data` (FSDP)."""
  return any(DATA_AXIS in s.spec for s in jax.tree.leaves(shardings))


def gather_over_data(params, shardings, cast_dtype=None, explicit=True):
  """Parameters with their FSDP (`data`) split gathered; TP splits kept.

  Called where the parameters are used (the encoder blocks each gather
  their own). `explicit` (inside `over_data_shards`): an all-gather along
  the split dimension, whose gradient is a reduce-scatter, so the backward
  pass returns each device the sum of its shard's gradient and no more:
  half the bytes of all-reducing the whole gradient, sent as soon as each
  block's backward pass is done.

  Otherwise (the automatic partitioner's view, used with tensor
  parallelism, where the explicit form makes XLA gather the weights whole
  over `model` too): sharding constraints, whose backward sums the gradient
  over `data` (an all-reduce) and keeps this device's shard. Left to
  itself, XLA partitions FSDP's weight-gradient matmuls as windowed einsums
  fused with a reduce-scatter, which hold extra copies of the saved
  activations; this gather avoids them. docs/scaling.md has what each
  choice moved and held.

  With `cast_dtype`, gathered leaves of two or more dimensions are cast to
  it first: for kernels a layer uses in that dtype anyway, that gathers
  (and sums) half the bytes and never makes a full fp32 copy.
  """

  def gather(p, s):
    full = without_data(s)
    if tuple(full.spec) == tuple(s.spec):
      return p
    if cast_dtype is not None and p.ndim >= 2:
      p = p.astype(cast_dtype)
    if explicit:
      dim = list(s.spec).index(DATA_AXIS)
      return jax.lax.all_gather(p, DATA_AXIS, axis=dim, tiled=True)

    @jax.custom_vjp
    def all_gather(x):
      return jax.lax.with_sharding_constraint(x, full)

    def forward(x):
      return all_gather(x), None

    def backward(_, g):
      g = jax.lax.with_sharding_constraint(g, full)  # Summed over `data`.
      return (jax.lax.with_sharding_constraint(g, s),)

    all_gather.defvjp(forward, backward)
    return all_gather(p)

  return jax.tree.map(gather, params, shardings)


def over_data_shards(loss_fn: Callable, mesh: Mesh, params_sharding,
                     frozen_sharding=None):
  """`loss_fn(params, batch, rng) -> (loss, metrics)` run on each device's
  share of the batch, `data` made explicit (shard_map; other mesh axes stay
  automatic, so tensor parallelism is unchanged).

  Inside, parameters split over `data` are the device's shard (gather
  them with `gather_over_data(..., explicit=True)`), the batch is the
  device's rows and `rng` is folded with the device's index along `data`
  (dropout and augmentation draw differently on each share, as per-device
  keys do in data-parallel training); the activations' logical constraints
  keep their other axes.
  With `frozen_sharding`, `loss_fn(params, batch, rng, frozen)` also takes
  parameters it does not train (a distillation's teachers), which enter
  as their shards likewise.
  Loss and metrics are averaged over `data`; differentiating the result
  reduce-scatters FSDP gradients and all-reduces replicated ones. On
  several slices `slice` is explicit too: the parameters are whole across
  it, so their gradients are all-reduced over it (over DCN, once a step).
  """
  axes = batch_axes(mesh)
  data_only = lambda shardings: jax.tree.map(
      lambda s: P(*(a if a == DATA_AXIS else None for a in s.spec)), shardings)
  in_specs = (data_only(params_sharding), P(axes), P())
  if frozen_sharding is not None:
    in_specs += (data_only(frozen_sharding),)

  def on_shard(params, batch, rng, *frozen):
    rng = jax.random.fold_in(rng, jax.lax.axis_index(axes))
    rules = tuple((name, None if axis in (DATA_AXIS, axes) else axis)
                  for name, axis in nn.get_logical_axis_rules())
    with nn.logical_axis_rules(rules):
      loss, metrics = loss_fn(params, batch, rng, *frozen)
    return jax.lax.pmean((loss, metrics), axes)

  return jax.shard_map(
      on_shard, mesh=mesh, in_specs=in_specs, out_specs=P(),
      axis_names=set(axes) if isinstance(axes, tuple) else {axes})


def without_data(sharding: NamedSharding) -> NamedSharding:
  """The same sharding with nothing split over `data` (nothing to gather)."""
  return NamedSharding(
      sharding.mesh, P(*(None if a == DATA_AXIS else a for a in sharding.spec)))
