"""The jitted train step: gradients of the config's objective (accumulated
over micro-batches where asked), one optimizer update, the EMA. Imports no
TensorFlow: this is what runs on the accelerator, so the benchmark can use
it where only jax/flax/optax are installed.
"""

import functools
from typing import Callable

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
from vit_jax.models.attention import FP8_STATE
from vit_jax.training import fsdp
from vit_jax.training import objectives
from vit_jax.training import optim
from vit_jax.training import teachers as teachers_lib
from vit_jax.training.train_state import TrainState


def accumulate(grad_fn: Callable, params, batch, rng, accum_steps: int,
               mesh: Mesh, grads_sharding=None, frozen=()):
  """`grad_fn(params, batch, rng, *frozen)`'s ((loss, metrics), gradients)
  averaged over `accum_steps` micro-batches: the whole batch's update
  (without dropout or masked patch prediction's random corruption, which
  each micro-batch draws anew) in a fraction of the activation memory.
  `frozen`: what the loss reads but does not train (the teachers)."""
  if accum_steps == 1:
    return grad_fn(params, batch, rng, *frozen)

  # Micro-batch i takes every accum_steps-th example, so each device keeps
  # working on its own rows: (B, ...) -> (accum, B / accum, ...).
  def split(x):
    x = x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:])
    return jax.lax.with_sharding_constraint(
        jnp.swapaxes(x, 0, 1),
        NamedSharding(mesh, P(None, sharding.batch_axes(mesh))))

  micro = jax.tree.map(split, batch)

  def add_micro_batch(carry, xs):
    index, micro_batch = xs
    out = grad_fn(params, micro_batch, jax.random.fold_in(rng, index), *frozen)
    return jax.tree.map(jnp.add, carry, out), None

  first = jax.tree.map(lambda x: x[0], micro)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32),
                       jax.eval_shape(grad_fn, params, first, rng, *frozen))
  if grads_sharding is not None:  # The sums live where the shards do.
    zeros = (zeros[0], jax.lax.with_sharding_constraint(zeros[1],
                                                        grads_sharding))
  total, _ = jax.lax.scan(add_micro_batch, zeros,
                          (jnp.arange(accum_steps), micro))
  return jax.tree.map(lambda x: x / accum_steps, total)


def make_train_step(model, tx, objective: objectives.Objective, schedule,
                    mesh: Mesh, accum_steps: int = 1, ema_decay: float = 0.0,
                    params_sharding=None, frozen=(), fp8_sharding=None,
                    teachers=()):
  """`train_step(state, batch) -> (state, metrics)` for `objective`
  (`objectives.py`); with `teachers` (`teachers.py`, distillation),
  `train_step(state, batch, teacher_params)`, whose objective gets the
  teachers' logits of its images.

  `accum_steps > 1` averages the gradients of that many micro-batches before
  one update (`accumulate`). After each update a parameter the model
  bounds is clamped into its bounds (CLIP's temperature, `models.clamped`,
  as OpenCLIP clamps its logit scale after each optimizer step). With
  `ema_decay` the state's `ema_params` follow the parameters. Given the parameters' shardings, parameters split
  over `data` are gathered where `fsdp.gathering_plan` says. Parameters
  matching a regex of `frozen` (config.frozen) get no gradient computed;
  the metric `grad_norm` then counts the trained parameters only.

  With FP8 matmuls (config.model.fp8) the loss is differentiated by the
  parameters and the FP8 scaling state, whose "gradient" is its next value
  (Flax's fp8_ops); the amax a step records is the whole batch's (with
  gradient accumulation, the mean over its micro-batches').
  """
  fp8 = models.uses_fp8(model)
  clamped = functools.partial(models.clamped, model)  # CLIP's temperature.
  # FP8's amax is the whole batch's only where XLA partitions the step, and
  # an image-text loss has its own collectives over the batch
  # (`contrastive.py`): FSDP's explicit per-shard step is not used there.
  gathering = fsdp.gathering_plan(
      model, params_sharding, explicit=not (fp8 or models.is_two_towers(model)))
  model = gathering.wrap_model(model)

  run_teachers = teachers_lib.make_apply(teachers, gathering.explicit)

  def loss(trained, batch, rng, *teacher_params):  # trained: params, or
    # params and FP8 state; the teachers' parameters with teachers.
    params, collections = trained, {}
    if fp8:
      params, collections = trained["params"], {FP8_STATE: trained["fp8"]}
    batch = {**batch, "image": handover.images_in_value_range(batch["image"])}
    params = gathering.gather(optim.stop_frozen_gradients(frozen, params))

    def apply(images, **kwargs):  # The model in training mode.
      return model.apply({
          "params": params,
          **collections
      }, images, train=True, **kwargs)

    if teachers:
      return objective(apply, batch, rng,
                       functools.partial(run_teachers, teacher_params[0]))
    return objective(apply, batch, rng)

  trained_sharding = params_sharding
  if fp8 and params_sharding is not None:  # The FP8 state's: replicated.
    trained_sharding = {"params": params_sharding, "fp8": fp8_sharding}
  teachers_sharding = teachers_lib.shardings_of(teachers) if teachers else None
  grad_fn = jax.value_and_grad(
      gathering.wrap_loss(loss, mesh, teachers_sharding), has_aux=True)

  def train_step(state: TrainState, batch, *teacher_params):
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    if isinstance(objective, objectives.DrawnForBatch):
      batch = {
          **batch,
          **jax.lax.with_sharding_constraint(objective.draw(batch, rng),
                                             sharding.batch_sharding(mesh))
      }
    trained = ({
        "params": state.params,
        "fp8": state.fp8
    } if fp8 else state.params)
    (loss_value, objective_metrics), grads = accumulate(
        grad_fn, trained, batch, rng, accum_steps, mesh, trained_sharding,
        teacher_params)
    new_fp8 = state.fp8
    if fp8:
      grads, new_fp8 = grads["params"], grads["fp8"]
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = clamped(optax.apply_updates(state.params, updates))
    ema_params = state.ema_params
    if ema_params is not None:
      ema_params = optim.ema_update(ema_params, params, state.step, ema_decay)
    metrics = {
        "loss": loss_value,
        "learning_rate": schedule(state.step),
        "grad_norm": optax.tree.norm(grads),
        "param_norm": optax.tree.norm(params),
        **objective_metrics
    }
    return state.replace(step=state.step + 1, params=params,
                         opt_state=opt_state, ema_params=ema_params,
                         fp8=new_fp8), metrics

  return train_step


def jit_train_step(train_step, state_sharding, mesh: Mesh,
                   logical_axis_rules=(), teachers_sharding=None):
  """Explicit in/out shardings; the old state's buffers are donated (the
  teachers' parameters, where there are some, are not)."""
  in_shardings = (state_sharding, sharding.batch_sharding(mesh))
  if teachers_sharding is not None:
    in_shardings += (teachers_sharding,)
  return sharding.jit_on_mesh(
      train_step, mesh, logical_axis_rules, in_shardings=in_shardings,
      out_shardings=(state_sharding, sharding.replicated(mesh)),
      donate_argnums=0)


class WithTeachers:
  """A jitted `step(state, batch, teacher_params)` that is called, lowered
  and compiled as `step(state, batch)`: the teachers' parameters bound."""

  def __init__(self, step, teacher_params: tuple):
    self.step, self.teacher_params = step, teacher_params

  def __call__(self, state, batch):
    return self.step(state, batch, self.teacher_params)

  def lower(self, state, batch):
    return self.step.lower(state, batch, self.teacher_params)

  def compile(self, state, batch):
    return self.step.compile(state, batch, self.teacher_params)


def train_step_for_config(config: ml_collections.ConfigDict, model, tx,
                          schedule, mesh: Mesh, state_sharding, teachers=()):
  """The config's jitted train step: what training runs and the plan
  compiles (one definition, so the plan measures the real step); with a
  distillation's `teachers` (`teachers.load`), their parameters bound."""
  step = jit_train_step(
      make_train_step(model, tx, objectives.objective_for_config(
          config, mesh), schedule, mesh, config.accum_steps,
                      config.ema_decay, state_sharding.params,
                      tuple(config.frozen), state_sharding.fp8, teachers),
      state_sharding, mesh, config.sharding.logical_axis_rules,
      teachers_lib.shardings_of(teachers) if teachers else None)
  if not teachers:
    return step
  return WithTeachers(step, teachers_lib.params_of(teachers))
