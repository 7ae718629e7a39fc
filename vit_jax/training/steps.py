"""Train state, losses and the jitted update step. Imports no TensorFlow.

This is what runs on the accelerator, so benchmarks and inference can use it
where only jax/flax/optax are installed.
"""

from typing import Any
from typing import Callable

import flax
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import optax

from vit_jax import models
from vit_jax import sharding
from vit_jax.data import handover
from vit_jax.models import layout
from vit_jax.models import masked_patch
from vit_jax.training import mixup
from vit_jax.training import optim


def softmax_xent(logits, labels):
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), labels)


def sigmoid_xent(logits, labels):
  per_class = optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32),
                                                 labels)
  return jnp.sum(per_class, axis=-1)


LOSSES = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent}

# `objective(apply, batch, rng) -> (loss, metrics)`, where `apply(images,
# **kwargs)` is the model in training mode with its parameters bound.
Objective = Callable[[Callable, dict, jax.Array], tuple[jax.Array, dict]]


def weighted_mean(values_B, weights_B=None):
  """The mean over the examples of weight 1 (all, without weights). Written
  as mean(values x weights) x B / sum(weights): with every weight 1 that is
  exactly jnp.mean(values), bit for bit."""
  if weights_B is None:
    return jnp.mean(values_B)
  count = jnp.maximum(jnp.sum(weights_B), 1.0)
  return jnp.mean(values_B * weights_B) * (values_B.shape[0] / count)


def supervised(loss_fn: Callable, label_smoothing: float = 0.0,
               mixup_alpha: float = 0.0, mixup_p: float = 1.0) -> Objective:
  """Classification of `batch["labels"]`; label smoothing mixes the targets
  with the uniform distribution; with `mixup_alpha`, images and labels are
  mixed first (`vit_jax/training/mixup.py`)."""

  def objective(apply, batch, rng):
    images, labels = batch["image"], batch["labels"]
    mask_B = batch.get("mask")  # 0: an unreadable file's blank placeholder.
    if mixup_alpha > 0:  # Its own key; without mixup, dropout's stays as was.
      mixup_rng, rng = jax.random.split(rng)
      images, labels, own_B = mixup.mix(mixup_rng, images, labels, mixup_alpha,
                                        mixup_p)
      if mask_B is not None:  # Mixed with a placeholder: left out as well.
        mask_B = mask_B * jnp.where(own_B < 1, jnp.roll(mask_B, 1), 1.0)
    if label_smoothing:
      labels = optax.smooth_labels(labels, label_smoothing)
    logits, _ = apply(images, rngs={"dropout": rng})
    return weighted_mean(loss_fn(logits, labels), mask_B), {}

  return objective


def masked_patch_sums(apply, images, rng, mp_config, stride: int,
                      weights_B=None) -> dict[str, jax.Array]:
  """Masked patch prediction on `images` with a corruption drawn from
  `rng`: sums of the loss and of the correct predictions over the corrupted
  patches, and their count (each image weighted by `weights_B`, e.g. the
  evaluation's padding mask)."""
  corruption_rng, dropout_rng = jax.random.split(rng)
  batch, height, width = images.shape[:3]
  corruption = masked_patch.sample_corruption(
      corruption_rng, batch, (height // stride) * (width // stride),
      mp_config.corrupt_rate, mp_config.mask_rate, mp_config.replace_rate)
  _, out = apply(images, corruption=corruption, rngs={"dropout": dropout_rng})
  assert out["grid"][0] * out["grid"][1] == corruption.kind_BxN.shape[1], (
      f"{stride}-pixel patches do not match the model's grid {out['grid']}.")
  targets = masked_patch.patch_targets(images, out["grid"], mp_config.target,
                                       mp_config.color_bits,
                                       mp_config.downsized_size)
  loss_BxN, correct_BxN = masked_patch.per_patch_loss_and_correct(
      out["patch_predictions"], targets, mp_config.target, mp_config.color_bits)
  weights_BxN = corruption.corrupted_BxN.astype(jnp.float32)
  if weights_B is not None:
    weights_BxN = weights_BxN * weights_B[:, None]
  return {
      "loss": jnp.sum(loss_BxN * weights_BxN),
      "correct": jnp.sum(correct_BxN * weights_BxN),
      "count": jnp.sum(weights_BxN)
  }


def masked_patch_prediction(mp_config, stride: int) -> Objective:
  """The paper's self-supervision (`models/masked_patch.py`): labels are not
  read. Metrics: the per-patch accuracy on the corrupted patches."""

  def objective(apply, batch, rng):
    sums = masked_patch_sums(apply, batch["image"], rng, mp_config, stride,
                             batch.get("mask"))
    count = jnp.maximum(sums["count"], 1.0)  # A batch of placeholders: 0.
    return sums["loss"] / count, {"accuracy": sums["correct"] / count}

  return objective


# config.objective -> the config's objective.
OBJECTIVES: dict[str, Callable[[ml_collections.ConfigDict], Objective]] = {
    "supervised": lambda config: supervised(LOSSES[
        config.loss], config.label_smoothing, config.mixup.alpha, config.mixup.p
                                           ),
    "masked_patch": lambda config: masked_patch_prediction(
        config.masked_patch,
        models.get_variant(config.model.variant).stride),
}


def objective_for_config(config: ml_collections.ConfigDict) -> Objective:
  return OBJECTIVES[config.objective](config)


def model_for_config(config: ml_collections.ConfigDict, num_classes):
  """The config's model: with a head of `num_classes` (None: none); for
  masked patch prediction, no head but the [mask] token and patch head."""
  if config.objective != "masked_patch":
    return models.build_model(config.model, num_classes)
  mp = config.masked_patch
  stride = models.get_variant(config.model.variant).stride
  return models.build_model(
      config.model, None,
      masked_patch.output_width(mp.target, stride, mp.color_bits,
                                mp.downsized_size))


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: number of updates applied.
  params: Any
  opt_state: Any
  rng: jax.Array  # uint32 key data; the dropout key of step s folds in s.
  ema_params: Any = None  # Polyak average of params; None when disabled.

  def eval_params(self):
    """The parameters evaluation uses: the average when there is one."""
    return self.params if self.ema_params is None else self.ema_params


def replicate_all() -> ml_collections.ConfigDict:
  """The sharding config that replicates every parameter (a plain DP run)."""
  return ml_collections.ConfigDict(
      dict(params=((".*", "replicate"),), fsdp_min_size=0,
           logical_axis_rules=()))


def _init_fn(model, tx, image_size: int, ema: bool):

  def init(rng):
    params_rng, dropout_rng = jax.random.split(rng)
    params = models.init_on_zeros(model, params_rng, image_size)
    return TrainState(step=jnp.zeros(
        (), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(dropout_rng),
                      ema_params=params if ema else None)

  return init


def abstract_train_state(model, tx, image_size: int, mesh: Mesh,
                         sharding_config=None, ema: bool = False):
  """(state of ShapeDtypeStructs carrying their shardings, state shardings).

  Shapes come from `jax.eval_shape` and each leaf's sharding from the
  partitioning rules: nothing is allocated, so this also describes a state
  for devices that are not attached (see `vit_jax/performance/planning.py`).
  """
  sharding_config = sharding_config or replicate_all()
  abstract = jax.eval_shape(_init_fn(model, tx, image_size, ema),
                            jax.random.key(0))
  specs = sharding.param_partition_specs(abstract.params, mesh, sharding_config)
  state_sharding = sharding.state_shardings(abstract, abstract.params, specs,
                                            mesh)
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract,
      state_sharding), state_sharding


def create_train_state(model, tx, image_size: int, seed: int, mesh: Mesh,
                       sharding_config=None, ema: bool = False):
  """Initialises the state directly with its shardings (no host copy).

  Shapes and shardings come first (`abstract_train_state`), then `init` is
  compiled to write every shard in place. Returns (state, state shardings).
  """
  _, state_sharding = abstract_train_state(model, tx, image_size, mesh,
                                           sharding_config, ema)
  init = _init_fn(model, tx, image_size, ema)
  state = jax.jit(init, out_shardings=state_sharding)(jax.random.key(seed))
  return state, state_sharding


def make_train_step(model, tx, objective: Objective, schedule, mesh: Mesh,
                    accum_steps: int = 1, ema_decay: float = 0.0,
                    params_sharding=None, frozen=()):
  """`train_step(state, batch) -> (state, metrics)` for `objective` (see
  `supervised` and `masked_patch_prediction`).

  With `accum_steps > 1` the batch is split into that many micro-batches whose
  gradients are averaged before one update: the same update as the whole
  batch at once (without dropout or masked patch prediction's random
  corruption, which each micro-batch draws anew), in a fraction of the
  activation memory.
  With `ema_decay` the state's `ema_params` follow the parameters. Given the
  parameters' shardings, a step with parameters split over `data` (FSDP)
  gathers them where they are used (the encoder blocks' inside each block,
  see `_gather_in_blocks`) and returns their gradients to their shards
  (`sharding.gather_over_data`): without tensor parallelism the loss runs on
  each device's share (`sharding.over_data_shards`) and the gradients are
  reduce-scattered. Parameters
  matching a regex of `frozen` (config.frozen) get no gradient computed;
  the metric `grad_norm` then counts the trained parameters only.
  """
  grads_sharding = params_sharding  # Gradients are sharded as the params.
  fsdp = params_sharding is not None and sharding.splits_over_data(
      params_sharding)
  # Explicit collectives where `data` is the only split (see
  # sharding.gather_over_data for tensor parallelism's case).
  explicit = fsdp and mesh.shape[sharding.MODEL_AXIS] == 1
  if fsdp:  # What the loss gathers: the rest.
    model, params_sharding = _gather_in_blocks(model, params_sharding, explicit)

  def loss(params, batch, rng):
    batch = {**batch, "image": handover.images_in_value_range(batch["image"])}
    params = optim.stop_frozen_gradients(frozen, params)
    if fsdp:
      params = sharding.gather_over_data(params, params_sharding,
                                         explicit=explicit)
    apply = lambda images, **kw: model.apply({"params": params}, images, train=
                                             True, **kw)
    return objective(apply, batch, rng)

  if explicit:
    loss = sharding.over_data_shards(loss, mesh, grads_sharding)
  grad_fn = jax.value_and_grad(loss, has_aux=True)

  def accumulated_grads(params, batch, rng):
    """((loss, objective's metrics), gradients), averaged over micro-batches."""
    if accum_steps == 1:
      return grad_fn(params, batch, rng)
    # Micro-batch i takes every accum_steps-th example, so each device keeps
    # working on its own rows: (B, ...) -> (accum, B / accum, ...).
    def split(x):
      x = x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:])
      return jax.lax.with_sharding_constraint(
          jnp.swapaxes(x, 0, 1), NamedSharding(mesh, P(None,
                                                       sharding.DATA_AXIS)))

    micro = jax.tree.map(split, batch)

    def add_micro_batch(carry, xs):
      index, mb = xs
      out = grad_fn(params, mb, jax.random.fold_in(rng, index))
      return jax.tree.map(jnp.add, carry, out), None

    zeros = jax.tree.map(
        lambda x: jnp.zeros(x.shape, jnp.float32),
        jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro),
                       rng))
    if grads_sharding is not None:  # The sums live where the shards do.
      zeros = (zeros[0],
               jax.lax.with_sharding_constraint(zeros[1], grads_sharding))
    total, _ = jax.lax.scan(add_micro_batch, zeros,
                            (jnp.arange(accum_steps), micro))
    return jax.tree.map(lambda x: x / accum_steps, total)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    (loss_value, objective_metrics), grads = accumulated_grads(
        state.params, batch, rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": loss_value,
        "learning_rate": schedule(state.step),
        "grad_norm": optax.tree.norm(grads),
        "param_norm": optax.tree.norm(params),
        **objective_metrics
    }
    ema_params = state.ema_params
    if ema_params is not None:
      ema_params = optim.ema_update(ema_params, params, state.step, ema_decay)
    return state.replace(step=state.step + 1, params=params,
                         opt_state=opt_state, ema_params=ema_params), metrics

  return train_step


def _gather_in_blocks(model, params_sharding, explicit=True):
  """FSDP: the encoder blocks gather their own parameters (`vit.Encoder`), so
  the backward pass gathers them again rather than keeping them all; the
  loss gathers the rest. Returns the model and the shardings left to gather
  in the loss (all of them when the blocks are not sharded alike)."""
  names = layout.encoder_blocks(params_sharding)
  encoder = params_sharding.get(layout.ENCODER, {})
  if not names or any(encoder[k] != encoder[names[0]] for k in names):
    return model, params_sharding
  per_block = encoder[names[0]]
  if layout.is_scanned(params_sharding):  # Without the layer axis (never
    per_block = jax.tree.map(  # split), as each step of the scan sees it.
        lambda s: NamedSharding(s.mesh, P(*s.spec[1:])), per_block)
  if not sharding.splits_over_data(per_block):
    return model, params_sharding  # Nothing split over `data`.
  vit = models.vit_of(model)
  cast = vit.dtype if vit.dtype != vit.param_dtype else None
  gather = lambda v: {
      "params": sharding.gather_over_data(v["params"], per_block, cast, explicit
                                         )
  }
  blocks_done = {
      k: jax.tree.map(sharding.without_data, encoder[k]) for k in names
  }
  return models.with_block_gather(model, gather), {
      **params_sharding, layout.ENCODER: {
          **encoder,
          **blocks_done
      }
  }


def blocks_gather_their_params(model, params_sharding) -> bool:
  """Whether the encoder blocks gather their own FSDP-sharded parameters
  (so the backward pass gathers them again)."""
  return _gather_in_blocks(model, params_sharding)[1] is not params_sharding


def jit_train_step(train_step, state_sharding, mesh: Mesh,
                   logical_axis_rules=()):
  """Explicit in/out shardings; the old state's buffers are donated."""
  return sharding.jit_on_mesh(
      train_step, mesh, logical_axis_rules,
      in_shardings=(state_sharding, sharding.batch_sharding(mesh)),
      out_shardings=(state_sharding, sharding.replicated(mesh)),
      donate_argnums=0)


def train_step_for_config(config: ml_collections.ConfigDict, model, tx,
                          schedule, mesh: Mesh, state_sharding):
  """The config's jitted train step: what training runs and the plan
  compiles (one definition, so the plan measures the real step)."""
  return jit_train_step(
      make_train_step(model, tx, objective_for_config(config), schedule, mesh,
                      config.accum_steps,
                      config.ema_decay, state_sharding.params,
                      tuple(config.frozen)), state_sharding, mesh,
      config.sharding.logical_axis_rules)
