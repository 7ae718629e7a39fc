"""FSDP's gathering, decided once: where a step gathers the parameters that
are split over the mesh's `data` axis.

The encoder blocks gather their own (`vit.Encoder`'s `gather_block`), so
the backward pass gathers them again rather than keeping every block's
whole parameters alive; the loss gathers the rest (all of them where the
blocks are not sharded alike). Where `data` is the only split, the
collectives are explicit: the loss runs on each device's share of the batch
(`over_data_shards`) and the gradients are reduce-scattered.
Below the plan, the gathering itself: explicit all-gathers (whose
gradients are reduce-scatters) or sharding constraints, and the loss run on
each device's share of the batch. Imports no TensorFlow.
"""

import dataclasses
import functools
from typing import Any
from typing import Callable
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax import models
from vit_jax import sharding
from vit_jax.models import scan
from vit_jax.sharding import DATA_AXIS


@dataclasses.dataclass(frozen=True)
class FsdpPlan:
  """Where a step gathers FSDP-split parameters (`gathering_plan`)."""
  params_sharding: Any  # Where parameters and their gradients live.
  loss_gathers: Any = None  # The shardings the loss gathers (None: none).
  block_gather: Optional[Callable] = None  # An encoder block's own gather.
  explicit: bool = False  # Explicit collectives: the loss runs per shard.

  def wrap_model(self, model):
    """The model whose encoder blocks gather their own parameters."""
    if self.block_gather is None:
      return model
    return models.with_block_gather(model, self.block_gather)

  def gather(self, params):
    """The parameters the loss reads, gathered over `data`."""
    if self.loss_gathers is None:
      return params
    return gather_over_data(params, self.loss_gathers, explicit=self.explicit)

  def wrap_loss(self, loss: Callable, mesh: Mesh, trained_sharding,
                frozen_sharding=()) -> Callable:
    """`loss(trained, batch, rng, frozen)` run on each device's share of
    the batch (explicit only); `trained_sharding` and `frozen_sharding`:
    those of the trees it trains and of those it takes but does not train
    (`over_data_shards`)."""
    if not self.explicit:
      return loss
    return over_data_shards(loss, mesh, trained_sharding, frozen_sharding)


def _gather_block(variables, per_block, cast, explicit):
  return {
      "params": gather_over_data(variables["params"], per_block, cast, explicit)
  }


def gathering_plan(model, params_sharding, explicit: bool = True) -> FsdpPlan:
  """The plan for parameters sharded as `params_sharding` (None: not
  given); it gathers nothing where nothing is split over `data`.
  `explicit=False` leaves the collectives to XLA's partitioner even where
  `data` is the only split."""
  if params_sharding is None or not splits_over_data(params_sharding):
    return FsdpPlan(params_sharding)
  mesh = jax.tree.leaves(params_sharding)[0].mesh
  explicit = explicit and mesh.shape[sharding.MODEL_AXIS] == 1
  names = scan.encoder_blocks(params_sharding)
  encoder = params_sharding.get(scan.ENCODER, {})
  whole = FsdpPlan(params_sharding, params_sharding, explicit=explicit)
  if not names or any(encoder[k] != encoder[names[0]] for k in names):
    return whole  # Blocks sharded unlike: the loss gathers everything.
  per_block = encoder[names[0]]
  if scan.is_scanned(params_sharding):  # Without the layer axis (never
    per_block = jax.tree.map(  # split), as each step of the scan sees it.
        lambda s: NamedSharding(s.mesh, P(*s.spec[1:])), per_block)
  if not splits_over_data(per_block):
    return whole  # The blocks are not split over `data`.
  vit = models.vit_of(model)
  form = vit.form
  cast = jnp.dtype(form.dtype) if form.dtype != form.param_dtype else None
  blocks_done = {k: jax.tree.map(without_data, encoder[k]) for k in names}
  return FsdpPlan(
      params_sharding, {
          **params_sharding, scan.ENCODER: {
              **encoder,
              **blocks_done
          }
      },
      functools.partial(_gather_block, per_block=per_block, cast=cast,
                        explicit=explicit), explicit)


def blocks_gather(model, params_sharding) -> bool:
  """Whether the encoder blocks gather their own FSDP-split parameters (so
  the backward pass gathers them again)."""
  return gathering_plan(model, params_sharding).block_gather is not None


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
                     frozen_sharding=()):
  """`loss_fn(params, batch, rng, frozen) -> (loss, metrics)` run on each
  device's share of the batch, `data` made explicit (shard_map; other mesh
  axes stay automatic, so tensor parallelism is unchanged).

  Inside, parameters split over `data` are the device's shard (gather
  them with `gather_over_data(..., explicit=True)`), the batch is the
  device's rows and `rng` is folded with the device's index along `data`
  (dropout and augmentation draw differently on each share, as per-device
  keys do in data-parallel training); the activations' logical constraints
  keep their other axes.
  `frozen` are parameters it does not train (a distillation's teachers;
  () where there are none), which enter as their shards likewise.
  Loss and metrics are averaged over `data`; differentiating the result
  reduce-scatters FSDP gradients and all-reduces replicated ones. On
  several slices `slice` is explicit too: the parameters are whole across
  it, so their gradients are all-reduced over it (over DCN, once a step).
  """
  axes = sharding.batch_axes(mesh)
  data_only = lambda shardings: jax.tree.map(
      lambda s: P(*(a if a == DATA_AXIS else None for a in s.spec)), shardings)
  in_specs = (data_only(params_sharding), P(axes), P(),
              data_only(frozen_sharding))

  def on_shard(params, batch, rng, frozen):
    rng = jax.random.fold_in(rng, jax.lax.axis_index(axes))
    rules = tuple((name, None if axis in (DATA_AXIS, axes) else axis)
                  for name, axis in nn.get_logical_axis_rules())
    with nn.logical_axis_rules(rules):
      loss, metrics = loss_fn(params, batch, rng, frozen)
    return jax.lax.pmean((loss, metrics), axes)

  return jax.shard_map(
      on_shard, mesh=mesh, in_specs=in_specs, out_specs=P(),
      axis_names=set(axes) if isinstance(axes, tuple) else {axes})


def without_data(sharding: NamedSharding) -> NamedSharding:
  """The same sharding with nothing split over `data` (nothing to gather)."""
  return NamedSharding(
      sharding.mesh, P(*(None if a == DATA_AXIS else a for a in sharding.spec)))
