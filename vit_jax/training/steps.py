"""The jitted train step: gradients of an objective's loss (accumulated
over micro-batches where asked), one optimizer update, the EMA. What the
step is given for a config (its objective's loss, model and teachers) is
`vit_jax/objectives/`'s to say. Imports no TensorFlow: this is what runs
on the accelerator, so the benchmark can use it where only
jax/flax/optax are installed.
"""

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import optax

from vit_jax import models
from vit_jax import sharding
from vit_jax.data import handover
from vit_jax.models.attention import FP8_STATE
from vit_jax.training import fsdp
from vit_jax.training import losses
from vit_jax.training import optim
from vit_jax.training import teachers as teachers_lib
from vit_jax.training.train_state import TrainState


def accumulate(grad_fn: Callable, params, batch, rng, accum_steps: int,
               mesh: Mesh, grads_sharding=None, teacher_params=()):
  """`grad_fn(params, batch, rng, teacher_params)`'s ((loss, metrics),
  gradients) averaged over `accum_steps` micro-batches: the whole batch's
  update (without dropout or masked patch prediction's random corruption,
  which each micro-batch draws anew) in a fraction of the activation
  memory. `teacher_params`: what the loss reads but does not train."""
  if accum_steps == 1:
    return grad_fn(params, batch, rng, teacher_params)

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
    out = grad_fn(params, micro_batch, jax.random.fold_in(rng, index),
                  teacher_params)
    return jax.tree.map(jnp.add, carry, out), None

  first = jax.tree.map(lambda x: x[0], micro)
  zeros = jax.tree.map(
      lambda x: jnp.zeros(x.shape, jnp.float32),
      jax.eval_shape(grad_fn, params, first, rng, teacher_params))
  if grads_sharding is not None:  # The sums live where the shards do.
    zeros = (zeros[0], jax.lax.with_sharding_constraint(zeros[1],
                                                        grads_sharding))
  total, _ = jax.lax.scan(add_micro_batch, zeros,
                          (jnp.arange(accum_steps), micro))
  return jax.tree.map(lambda x: x / accum_steps, total)


def make_train_step(model, tx, loss: losses.Loss, schedule, mesh: Mesh,
                    accum_steps: int = 1, ema_decay: float = 0.0,
                    params_sharding=None, frozen=(), fp8_sharding=None,
                    teachers=()):
  """`train_step(state, batch, teacher_params) -> (state, metrics)` for an
  objective's `loss` (`losses.Loss`: its sums over the batch, a draw once
  per global batch); `teacher_params`: the parameters of `teachers`
  (`teachers.py`, a distillation's; () where there are none), whose
  logits of its images the loss reads.

  The loss is the objective's sum over the batch's examples divided by
  their count; its metrics the other sums likewise (`losses.Sums`).
  `accum_steps > 1` averages the gradients of that many micro-batches before
  one update (`accumulate`). After each update a parameter the model
  bounds is clamped into its bounds (CLIP's temperature, `models.clamped`,
  as OpenCLIP clamps its logit scale after each optimizer step). With
  `ema_decay` the state's `ema_params` follow the parameters. Given the
  parameters' shardings, parameters split over `data` are gathered where
  `fsdp.gathering_plan` says. Parameters
  matching a regex of `frozen` (config.frozen) get no gradient computed;
  the metric `grad_norm` then counts the trained parameters only.

  What is differentiated is `{"params": ...}`, with FP8 matmuls
  (config.model.fp8) and the FP8 scaling state beside it, whose "gradient"
  is its next value (Flax's fp8_ops); the amax a step records is the whole
  batch's (with gradient accumulation, the mean over its micro-batches').
  """
  fp8 = models.uses_fp8(model)
  clamped = functools.partial(models.clamped, model)  # CLIP's temperature.
  # FP8's amax is the whole batch's only where XLA partitions the step, and
  # a loss with collectives of its own over the batch (`contrastive.py`)
  # cannot run per shard: FSDP's explicit per-shard step is not used there.
  gathering = fsdp.gathering_plan(model, params_sharding,
                                  explicit=not (fp8 or loss.across_batch))
  model = gathering.wrap_model(model)
  run_teachers = teachers_lib.make_apply(teachers, gathering.explicit)

  def mean_loss(trained, batch, rng, teacher_params):
    """The loss of `trained` ({"params"[, FP8_STATE]}) on `batch`."""
    params = gathering.gather(
        optim.stop_frozen_gradients(frozen, trained["params"]))
    variables = {**trained, "params": params}
    batch = {**batch, "image": handover.images_in_value_range(batch["image"])}

    def forward(images, **kwargs):  # The model in training mode.
      return model.apply(variables, images, train=True, **kwargs)

    read_teachers = (functools.partial(run_teachers, teacher_params)
                     if teachers else None)
    return loss(forward, batch, rng, read_teachers)

  trained_sharding = None
  if params_sharding is not None:
    trained_sharding = {"params": params_sharding}
    if fp8:  # The FP8 state's: replicated.
      trained_sharding[FP8_STATE] = fp8_sharding
  teachers_sharding = teachers_lib.shardings_of(teachers)
  grad_fn = jax.value_and_grad(
      gathering.wrap_loss(mean_loss, mesh, trained_sharding, teachers_sharding),
      has_aux=True)

  def train_step(state: TrainState, batch, teacher_params=()):
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    if loss.draw is not None:
      batch = {
          **batch,
          **jax.lax.with_sharding_constraint(loss.draw(batch, rng),
                                             sharding.batch_sharding(mesh))
      }
    trained = {"params": state.params}
    if fp8:
      trained[FP8_STATE] = state.fp8
    (loss_value, objective_metrics), grads = accumulate(
        grad_fn, trained, batch, rng, accum_steps, mesh, trained_sharding,
        teacher_params)
    new_fp8 = grads.get(FP8_STATE, state.fp8)
    grads = grads["params"]
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


def jit_train_step(
    train_step, state_sharding, mesh: Mesh, logical_axis_rules=(),
    teachers=()) -> "BoundStep":
  """`train_step` jitted with explicit in/out shardings, the old state's
  buffers donated (the teachers' parameters are not), and called as
  `step(state, batch)`: the teachers' parameters bound."""
  jitted = sharding.jit_on_mesh(
      train_step, mesh, logical_axis_rules,
      in_shardings=(state_sharding, sharding.batch_sharding(mesh),
                    teachers_lib.shardings_of(teachers)),
      out_shardings=(state_sharding, sharding.replicated(mesh)),
      donate_argnums=0)
  return BoundStep(jitted, teachers_lib.params_of(teachers))


class BoundStep:
  """A jitted `step(state, batch, teacher_params)` that is called, lowered
  and compiled as `step(state, batch)`: the teachers' parameters bound."""

  def __init__(self, step, teacher_params: tuple):
    self.step, self.teacher_params = step, teacher_params

  def __call__(self, state, batch):
    return self.step(state, batch, self.teacher_params)

  def lower(self, state, batch) -> "_Bound":
    return _Bound(self.step.lower(state, batch, self.teacher_params),
                  self.teacher_params)

  def compile(self, state, batch) -> "_Bound":
    """Compiled ahead of the first call (`sharding.jit_on_mesh.compile`)."""
    return _Bound(self.step.compile(state, batch, self.teacher_params),
                  self.teacher_params)


class _Bound:
  """A lowered or compiled step taking (state, batch), the teachers'
  parameters bound; its other attributes are the wrapped one's (memory
  and cost analyses, the program's text)."""

  def __init__(self, wrapped, teacher_params: tuple):
    self._wrapped, self._teacher_params = wrapped, teacher_params

  def __call__(self, state, batch):
    return self._wrapped(state, batch, self._teacher_params)

  def compile(self, *args, **kwargs) -> "_Bound":
    return _Bound(self._wrapped.compile(*args, **kwargs), self._teacher_params)

  def __getattr__(self, name):
    return getattr(self._wrapped, name)
