"""Optimizers and learning-rate schedules from the config."""

import ml_collections
import optax

OPTIMIZERS = ("adam", "sgd")
DECAY_TYPES = ("cosine", "linear", "constant")


def make_schedule(config: ml_collections.ConfigDict,
                  total_steps: int) -> optax.Schedule:
  """Linear warmup to `lr`, then cosine/linear decay to 0 (or constant)."""
  warmup = min(config.warmup_steps, total_steps)
  decay_steps = max(total_steps - warmup, 1)
  decay = {
      "cosine": lambda: optax.cosine_decay_schedule(config.lr, decay_steps),
      "linear": lambda: optax.linear_schedule(config.lr, 0.0, decay_steps),
      "constant": lambda: optax.constant_schedule(config.lr),
  }[config.decay_type]()
  if warmup == 0:
    return decay
  return optax.join_schedules(
      [optax.linear_schedule(0.0, config.lr, warmup), decay], [warmup])


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int):
  """Returns (optax transformation, schedule)."""
  schedule = make_schedule(config, total_steps)
  if config.optimizer == "adam":
    opt = optax.adamw(schedule, b1=config.b1, b2=config.b2,
                      weight_decay=config.weight_decay)
  else:
    opt = optax.chain(optax.add_decayed_weights(config.weight_decay),
                      optax.sgd(schedule, momentum=config.momentum))
  if config.grad_clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), opt)
  return opt, schedule
