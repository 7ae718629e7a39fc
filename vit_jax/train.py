"""The training loop: `train_and_evaluate(config, workdir)`.

config -> data (tf.data, per-process share) -> global sharded batch ->
jit(train_step, donated state) -> clu metric writers + periodic evaluation.
"""

import math
import os
import time

import jax
import ml_collections
import numpy as np
from absl import logging
from clu import metric_writers, periodic_actions
from jax.sharding import Mesh

from vit_jax import checkpoint, models, optim, sharding, steps
from vit_jax.data import input_pipeline, preprocess
from vit_jax.evaluators import classification


def check_config(config: ml_collections.ConfigDict, mesh: Mesh):
  """Every user mistake we can see before compiling, with its fix."""
  models.check_model_config(config.model)
  preprocess.parse(config.pp_train)
  preprocess.parse(config.pp_eval)
  for field, allowed in (("optimizer", optim.OPTIMIZERS),
                         ("decay_type", optim.DECAY_TYPES),
                         ("loss", steps.LOSSES)):
    if config[field] not in allowed:
      raise ValueError(f"config.{field}={config[field]!r} is not one of "
                       f"{', '.join(allowed)}.")
  stride = models.get_variant(config.model.variant).stride
  if config.image_size % stride:
    raise ValueError(
        f"config.image_size={config.image_size} is not divisible by the patch "
        f"size {stride} of {config.model.variant}; use a multiple of {stride} "
        f"(e.g. {max(stride, round(config.image_size / stride) * stride)}).")
  sharding.check_batch_size(config.batch_size, mesh, "batch_size",
                            config.accum_steps)
  sharding.check_batch_size(config.eval_batch_size, mesh, "eval_batch_size")


def total_steps(config: ml_collections.ConfigDict, num_train_examples: int):
  if config.num_epochs is not None:
    return math.ceil(config.num_epochs * num_train_examples / config.batch_size)
  return config.total_steps


def _write_config(config, workdir):
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict[str, float]:
  """Trains, evaluates periodically and at the end; returns final metrics."""
  mesh = sharding.make_mesh()
  check_config(config, mesh)
  os.makedirs(workdir, exist_ok=True)
  _write_config(config, workdir)
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0)

  source = input_pipeline.make_source(config)
  info = input_pipeline.get_info(config, source)
  num_steps = total_steps(config, info.num_train_examples)
  model = models.build_model(config.model, info.num_classes)
  tx, schedule = optim.make_optimizer(config, num_steps)
  loss_fn = steps.LOSSES[config.loss]

  state, state_sharding = steps.create_train_state(
      model, tx, config.image_size, config.seed, mesh)
  train_step = steps.jit_train_step(
      steps.make_train_step(model, tx, loss_fn, schedule, mesh,
                            config.accum_steps), state_sharding, mesh)
  evaluator = classification.ClassificationEvaluator(
      model, lambda: input_pipeline.make_eval_dataset(
          config, source).as_numpy_iterator(),
      mesh, loss_fn, state_sharding.params)
  manager = checkpoint.make_manager(workdir, config)
  state = checkpoint.restore_latest(manager, state, state_sharding)
  start_step = int(state.step)
  train_iter = input_pipeline.prefetch_to_device(
      input_pipeline.make_train_iterator(config, source, start_step), mesh)

  logging.info("Training %s on %s from step %d to %d (%d classes) on %d "
               "devices.", config.model.variant, config.dataset, start_step,
               num_steps, info.num_classes, jax.device_count())
  preemption = checkpoint.PreemptionFlag()
  try:
    result = _loop(config, state, train_step, train_iter, evaluator, manager,
                   writer, preemption, start_step, num_steps)
  finally:
    preemption.restore()
    manager.wait_until_finished()
    manager.close()
    writer.flush()
  return result


def _loop(config, state, train_step, train_iter, evaluator, manager, writer,
          preemption, start_step, num_steps) -> dict[str, float]:
  progress = periodic_actions.ReportProgress(num_train_steps=num_steps,
                                             writer=writer)
  hooks = [progress] if jax.process_index() == 0 else []
  result = {}
  pending = None  # (step, metrics) of the last dispatched step.
  tick = time.perf_counter()
  for step in range(start_step + 1, num_steps + 1):
    state, metrics = train_step(state, next(train_iter))
    # Metrics of the previous step are fetched after this one is dispatched.
    if pending is not None:
      result.update(_log_train(writer, *pending, config, tick))
      if pending[0] % config.log_every_steps == 0:
        tick = time.perf_counter()
    pending = (step, metrics)
    for hook in hooks:
      hook(step)
    if step % config.checkpoint_every_steps == 0 or preemption.raised:
      checkpoint.save(manager, step, state, force=preemption.raised)
    if preemption.raised:
      logging.warning("Stopped at step %d after SIGTERM; rerun the same "
                      "command to continue.", step)
      return {**result, "preempted_at_step": float(step)}
    if config.eval_every_steps and step % config.eval_every_steps == 0:
      result.update(_evaluate(evaluator, state, writer, step))
  if pending is not None:
    result.update(_log_train(writer, *pending, config, tick, final=True))
  if start_step < num_steps and num_steps % config.checkpoint_every_steps:
    checkpoint.save(manager, num_steps, state, force=True)
  if (not config.eval_every_steps or num_steps % config.eval_every_steps
      or start_step == num_steps):
    result.update(_evaluate(evaluator, state, writer, num_steps))
  return result


def _log_train(writer, step, metrics, config, tick,
               final=False) -> dict[str, float]:
  loss = float(metrics["loss"])
  if not np.isfinite(loss):
    raise FloatingPointError(
        f"Non-finite training loss {loss} at step {step}; lower config.lr, "
        "check the data, or enable config.grad_clip_norm.")
  if step % config.log_every_steps and not final:
    return {"train_loss": loss}
  scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
  elapsed = time.perf_counter() - tick
  steps_since_write = (step - 1) % config.log_every_steps + 1
  images_per_sec = steps_since_write * config.batch_size / max(elapsed, 1e-9)
  scalars["images_per_sec"] = images_per_sec
  scalars["images_per_sec_per_core"] = images_per_sec / jax.device_count()
  writer.write_scalars(step, {f"train/{k}": v for k, v in scalars.items()})
  return {"train_loss": loss}


def _evaluate(evaluator, state, writer, step) -> dict[str, float]:
  metrics = evaluator.run(state.params)
  writer.write_scalars(step, {f"test/{k}": v for k, v in metrics.items()})
  logging.info("Step %d: test accuracy %.4f on %d examples.", step,
               metrics["accuracy"], metrics["num_examples"])
  return {"test_accuracy": metrics["accuracy"], "test_loss": metrics["loss"]}
