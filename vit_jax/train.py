"""The training loop: `train_and_evaluate(config, workdir)`.

config -> data (tf.data, per-process share) -> global sharded batch ->
jit(train_step, donated state) -> clu metric writers + periodic evaluation.
"""

import datetime
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from clu import metric_writers, periodic_actions
from jax.sharding import Mesh

from vit_jax import checkpoint, models, optim, sharding, steps, weights
from vit_jax.data import input_pipeline, preprocess
from vit_jax.evaluators import classification, fewshot
from vit_jax.weights import posemb


def check_config(config: ml_collections.ConfigDict, mesh: Mesh):
  """Every user mistake we can see before compiling, with its fix."""
  models.check_model_config(config.model)
  preprocess.parse(config.pp_train)
  preprocess.parse(config.pp_eval)
  for field, allowed in (("optimizer", optim.OPTIMIZERS),
                         ("decay_type", optim.DECAY_TYPES),
                         ("loss", steps.LOSSES),
                         ("mu_dtype", optim.MOMENTUM_DTYPES)):
    if config[field] not in allowed:
      raise ValueError(f"config.{field}={config[field]!r} is not one of "
                       f"{', '.join(allowed)}.")
  stride = models.get_variant(config.model.variant).stride
  if config.image_size % stride:
    raise ValueError(
        f"config.image_size={config.image_size} is not divisible by the patch "
        f"size {stride} of {config.model.variant}; use a multiple of {stride} "
        f"(e.g. {max(stride, round(config.image_size / stride) * stride)}).")
  if config.init.posemb_resize not in posemb.METHODS:
    raise ValueError(f"config.init.posemb_resize={config.init.posemb_resize!r} "
                     f"is not one of {', '.join(posemb.METHODS)}.")
  for field in ("label_smoothing", "ema_decay"):
    if not 0.0 <= config[field] < 1.0:
      raise ValueError(f"config.{field}={config[field]} must be in [0, 1).")
  fewshot.check_fewshot_config(config.fewshot)
  sharding.check_strategy_rules(config.sharding.params)
  sharding.check_batch_size(config.batch_size, mesh, "batch_size",
                            config.accum_steps)
  sharding.check_batch_size(config.eval_batch_size, mesh, "eval_batch_size")


def warn_if_loss_mismatches_labels(config: ml_collections.ConfigDict,
                                   info: input_pipeline.DatasetInfo):
  if info.multi_label and config.loss == "softmax_xent":
    logging.warning(
        "%s has several labels per image but config.loss=softmax_xent "
        "spreads one probability over them; use "
        "--config.loss=sigmoid_xent to score each label on its own.",
        config.dataset)


def total_steps(config: ml_collections.ConfigDict, num_train_examples: int):
  if config.num_epochs is not None:
    return math.ceil(config.num_epochs * num_train_examples / config.batch_size)
  return config.total_steps


def warmup_steps(config: ml_collections.ConfigDict, num_train_examples: int):
  if config.warmup_epochs is not None:
    return math.ceil(config.warmup_epochs * num_train_examples /
                     config.batch_size)
  return config.warmup_steps


def _recorded_gelu(workdir: str, manager):
  """The GELU form a run being resumed was trained with, if recorded."""
  path = os.path.join(workdir, "config.json")
  if manager.latest_step() is None or not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f).get("model", {}).get("gelu_approximate")


def _write_config(config, workdir):
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict[str, float]:
  """Trains, evaluates periodically and at the end; returns final metrics."""
  mesh = sharding.mesh_from_config(config)
  check_config(config, mesh)
  os.makedirs(workdir, exist_ok=True)
  manager = checkpoint.make_manager(workdir, config)
  config = weights.resolve_gelu(config, _recorded_gelu(workdir, manager))
  _write_config(config, workdir)
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0)

  source = input_pipeline.make_source(config)
  info = input_pipeline.get_info(config, source)
  warn_if_loss_mismatches_labels(config, info)
  num_steps = total_steps(config, info.num_train_examples)
  model = models.build_model(config.model, info.num_classes)
  tx, schedule = optim.make_optimizer(
      config, num_steps, warmup_steps(config, info.num_train_examples))
  loss_fn = steps.LOSSES[config.loss]
  rules = config.sharding.logical_axis_rules

  state, state_sharding = steps.create_train_state(
      model, tx, config.image_size, config.seed, mesh, config.sharding,
      ema=config.ema_decay > 0)
  optim.check_param_rules(config, state.params)
  train_step = steps.jit_train_step(
      steps.make_train_step(model, tx, loss_fn, schedule, mesh,
                            config.accum_steps, config.label_smoothing,
                            config.ema_decay), state_sharding, mesh, rules)
  evaluator = classification.ClassificationEvaluator(
      model, lambda: input_pipeline.make_eval_dataset(
          config, source).as_numpy_iterator(),
      mesh, loss_fn, state_sharding.params, rules)
  fewshot_evaluator = (fewshot.FewShotEvaluator(
      model, config, mesh, state_sharding.params)
                       if config.fewshot.every_steps else None)
  if config.init.checkpoint and manager.latest_step() is None:
    params = weights.init_params(config, state.params, state_sharding.params)
    state = state.replace(params=params, ema_params=(  # Own buffers: donated.
        None if state.ema_params is None else jax.tree.map(jnp.copy, params)))
  state = checkpoint.restore_latest(manager, state, state_sharding)
  start_step = int(state.step)
  train_iter = input_pipeline.prefetch_to_device(
      input_pipeline.make_train_iterator(config, source, start_step), mesh)

  logging.info("Training %s on %s from step %d to %d (%d classes) on %d "
               "devices in %d processes, mesh %s.", config.model.variant,
               config.dataset, start_step, num_steps, info.num_classes,
               jax.device_count(), jax.process_count(), dict(mesh.shape))
  preemption = checkpoint.PreemptionFlag()
  try:
    result = _loop(config, workdir, state, train_step, train_iter,
                   (evaluator, fewshot_evaluator), manager, writer, preemption,
                   start_step, num_steps)
  finally:
    preemption.restore()
    manager.wait_until_finished()
    manager.close()
    writer.flush()
  return result


def _loop(config, workdir, state, train_step, train_iter, evaluators, manager,
          writer, preemption, start_step, num_steps) -> dict[str, float]:
  evaluator, fewshot_evaluator = evaluators
  hooks = []
  if jax.process_index() == 0:
    hooks.append(periodic_actions.ReportProgress(num_train_steps=num_steps,
                                                 writer=writer))
    if config.profile_steps:
      hooks.append(periodic_actions.Profile(  # Once, for profile_steps steps.
          num_profile_steps=config.profile_steps, profile_duration_ms=None,
          first_profile=start_step + 10, every_secs=None, logdir=workdir))
  result = {}
  pending = None  # (step, metrics) of the last dispatched step.
  timer = _Timer(start_step, num_steps, config.batch_size)
  for step in range(start_step + 1, num_steps + 1):
    state, metrics = train_step(state, next(train_iter))
    # Metrics of the previous step are fetched after this one is dispatched.
    if pending is not None:
      result.update(_log_train(writer, *pending, config, timer))
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
    if fewshot_evaluator and (step % config.fewshot.every_steps == 0 or
                              step == num_steps):
      result.update(_evaluate_fewshot(fewshot_evaluator, state, writer, step))
  if pending is not None:
    result.update(_log_train(writer, *pending, config, timer, final=True))
  if start_step < num_steps and num_steps % config.checkpoint_every_steps:
    checkpoint.save(manager, num_steps, state, force=True)
  if (not config.eval_every_steps or num_steps % config.eval_every_steps
      or start_step == num_steps):
    result.update(_evaluate(evaluator, state, writer, num_steps))
  return result


class _Timer:
  """Step time, throughput and ETA between two writes of the train metrics."""

  def __init__(self, start_step: int, num_steps: int, batch_size: int):
    self.num_steps, self.batch_size = num_steps, batch_size
    self.last_step, self.last_time = start_step, time.perf_counter()

  def lap(self, step: int) -> dict[str, float]:
    now = time.perf_counter()
    step_s = (now - self.last_time) / max(step - self.last_step, 1)
    self.last_step, self.last_time = step, now
    images_per_sec = self.batch_size / max(step_s, 1e-9)
    return {"step_time_s": step_s, "images_per_sec": images_per_sec,
            "images_per_sec_per_core": images_per_sec / jax.device_count(),
            "eta_s": step_s * (self.num_steps - step)}


def _log_train(writer, step, metrics, config, timer,
               final=False) -> dict[str, float]:
  loss = float(metrics["loss"])
  if not np.isfinite(loss):
    raise FloatingPointError(
        f"Non-finite training loss {loss} at step {step}; lower config.lr, "
        "check the data, or enable config.grad_clip_norm.")
  if step % config.log_every_steps and not final:
    return {"train_loss": loss}
  scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
  scalars.update(timer.lap(step))
  writer.write_scalars(step, {f"train/{k}": v for k, v in scalars.items()})
  if jax.process_index() == 0:
    logging.info("Step %d/%d: loss %.4f, lr %.3g, %.0f images/s, ETA %s.",
                 step, timer.num_steps, loss, scalars["learning_rate"],
                 scalars["images_per_sec"],
                 datetime.timedelta(seconds=round(scalars["eta_s"])))
  return {"train_loss": loss}


def _evaluate_fewshot(evaluator, state, writer, step) -> dict[str, float]:
  metrics = evaluator.run(state.eval_params())
  writer.write_scalars(step, {f"fewshot/{k}": v for k, v in metrics.items()})
  logging.info("Step %d: few-shot %s.", step, ", ".join(
      f"{k} {v:.4f}" for k, v in metrics.items() if not k.endswith("_std")))
  return {f"fewshot/{k}": v for k, v in metrics.items()}


def _evaluate(evaluator, state, writer, step) -> dict[str, float]:
  metrics = evaluator.run(state.eval_params())
  writer.write_scalars(step, {f"test/{k}": v for k, v in metrics.items()})
  logging.info("Step %d: test accuracy %.4f on %d examples.", step,
               metrics["accuracy"], metrics["num_examples"])
  return {"test_accuracy": metrics["accuracy"], "test_loss": metrics["loss"]}
