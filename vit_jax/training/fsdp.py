"""FSDP's gathering, decided once: where a step gathers the parameters that
are split over the mesh's `data` axis.

The encoder blocks gather their own (`vit.Encoder`'s `gather_block`), so
the backward pass gathers them again rather than keeping every block's
whole parameters alive; the loss gathers the rest (all of them where the
blocks are not sharded alike). Where `data` is the only split, the
collectives are explicit: the loss runs on each device's share of the batch
(`sharding.over_data_shards`) and the gradients are reduce-scattered.
Imports no TensorFlow.
"""

import dataclasses
import functools
from typing import Any
from typing import Callable
from typing import Optional

import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax import models
from vit_jax import sharding
from vit_jax.models import scan


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
    return sharding.gather_over_data(params, self.loss_gathers,
                                     explicit=self.explicit)

  def wrap_loss(self, loss: Callable, mesh: Mesh,
                frozen_sharding=None) -> Callable:
    """The loss run on each device's share of the batch (explicit only);
    `frozen_sharding`: that of the parameters it takes but does not train
    (`sharding.over_data_shards`)."""
    if not self.explicit:
      return loss
    return sharding.over_data_shards(loss, mesh, self.params_sharding,
                                     frozen_sharding)


def _gather_block(variables, per_block, cast, explicit):
  return {
      "params": sharding.gather_over_data(variables["params"], per_block, cast,
                                          explicit)
  }


def gathering_plan(model, params_sharding, explicit: bool = True) -> FsdpPlan:
  """The plan for parameters sharded as `params_sharding` (None: not
  given); it gathers nothing where nothing is split over `data`.
  `explicit=False` leaves the collectives to XLA's partitioner even where
  `data` is the only split."""
  if params_sharding is None or not sharding.splits_over_data(params_sharding):
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
  if not sharding.splits_over_data(per_block):
    return whole  # The blocks are not split over `data`.
  vit = models.vit_of(model)
  cast = vit.dtype if vit.dtype != vit.param_dtype else None
  blocks_done = {
      k: jax.tree.map(sharding.without_data, encoder[k]) for k in names
  }
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
