"""The train state (parameters, optimizer state, step, dropout key, EMA)
and its initialisation in place on the shards its parameters' rules give.
Imports no TensorFlow.
"""

from typing import Any

import flax
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from vit_jax import models
from vit_jax import sharding


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: number of updates applied.
  params: Any
  opt_state: Any
  rng: jax.Array  # uint32 key data; the dropout key of step s folds in s.
  ema_params: Any = None  # Polyak average of params; None when disabled.
  # The FP8 matmuls' scaling state (config.model.fp8; models.fp8_state):
  # each step's gradient of it is its next value. None without FP8.
  fp8: Any = None

  def eval_params(self):
    """The parameters evaluation uses: the average when there is one."""
    return self.params if self.ema_params is None else self.ema_params


def _init_fn(model, tx, image_size: int, ema: bool):

  def init(key):
    params_key, dropout_key = sharding.init_keys(key)
    params = models.init_on_zeros(model, params_key, image_size)
    return TrainState(step=jnp.zeros(
        (), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(dropout_key),
                      ema_params=params if ema else None, fp8=models.fp8_state(
                          model, params_key, image_size))

  return init


def abstract_train_state(model, tx, image_size: int, mesh: Mesh,
                         sharding_config=None, ema: bool = False):
  """(state of ShapeDtypeStructs carrying their shardings, state shardings).

  Shapes come from `jax.eval_shape` and each leaf's sharding from the
  partitioning rules: nothing is allocated, so this also describes a state
  for devices that are not attached (see `vit_jax/performance/planning.py`).
  """
  sharding_config = sharding_config or sharding.replicate_all()
  abstract = jax.eval_shape(_init_fn(model, tx, image_size, ema),
                            jax.random.key(0))
  specs = sharding.param_partition_specs(abstract.params, mesh, sharding_config)
  state_sharding = sharding.state_shardings(abstract, abstract.params, specs,
                                            mesh)
  return sharding.with_shardings(abstract, state_sharding), state_sharding


def create_train_state(model, tx, image_size: int, seed: int, mesh: Mesh,
                       sharding_config=None, ema: bool = False):
  """Initialises the state directly with its shardings (no host copy).

  Shapes and shardings come first (`abstract_train_state`), then `init` is
  compiled to write every shard in place. Returns (state, state shardings).
  """
  _, state_sharding = abstract_train_state(model, tx, image_size, mesh,
                                           sharding_config, ema)
  return initialise(model, tx, image_size, seed, state_sharding,
                    ema), state_sharding


def initialise(model, tx, image_size: int, seed: int, state_sharding,
               ema: bool = False):
  """The state at random init (`seed`), written on `state_sharding` (from
  `abstract_train_state`)."""
  init = _init_fn(model, tx, image_size, ema)
  return jax.jit(init, out_shardings=state_sharding)(jax.random.key(seed))
