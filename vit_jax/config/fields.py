"""Checks of config fields that need no knowledge of any layer: ranges of
numbers, and a field's value among a layer's choices (each layer checks its
own fields with these; `vit_jax/loop/checks.py` gathers them).
"""

from typing import Iterable

import ml_collections

from vit_jax.errors import UserError

# Fields that must be > 0, and fields that must be >= 0.
_POSITIVE = ("batch_size", "eval_batch_size", "image_size", "lr",
             "log_every_steps", "checkpoint_every_steps", "keep_checkpoints",
             "shuffle_buffer", "accum_steps")
_NON_NEGATIVE = ("total_steps", "warmup_steps", "eval_every_steps",
                 "keep_checkpoint_every_steps", "profile_steps", "weight_decay",
                 "grad_clip_norm", "mixup.alpha")
_FRACTIONS = (
    "label_smoothing",
    "ema_decay",
    "b1",
    "b2",
    "momentum",  # [0, 1)
    "model.drop_path_rate")


def _get(config, dotted: str):
  for part in dotted.split("."):
    config = config[part]
  return config


def check_numbers(config: ml_collections.ConfigDict):
  for field in _POSITIVE:
    if not _get(config, field) > 0:
      raise UserError(f"config.{field}={_get(config, field)} must be "
                      "positive.")
  for field in _NON_NEGATIVE:
    if _get(config, field) < 0:
      raise UserError(f"config.{field}={_get(config, field)} must be zero "
                      "or positive.")
  for field in _FRACTIONS:
    if not 0.0 <= _get(config, field) < 1.0:
      raise UserError(f"config.{field}={_get(config, field)} must be in "
                      "[0, 1).")
  length = config.sequence_length
  if length is not None and not length > 0:
    raise UserError(f"config.sequence_length={length} must be a positive "
                    "number of patches per image (or unset: images resized "
                    "to config.image_size).")
  if not 0.0 <= config.mixup.p <= 1.0:
    raise UserError(f"config.mixup.p={config.mixup.p} is a probability: "
                    "use a value in [0, 1].")
  pairs = (("num_epochs", "total_steps"), ("warmup_epochs", "warmup_steps"))
  for field, steps_field in pairs:
    value = config[field]
    if value is not None and (value < 0 or
                              (field == "num_epochs" and value == 0)):
      raise UserError(f"config.{field}={value} must be positive (or unset, "
                      f"to use config.{steps_field}).")
  if (config.num_epochs is None and config.total_steps == 0 and
      not config.init.checkpoint):
    raise UserError(
        "config.total_steps=0 trains nothing and there are no weights to "
        "evaluate; give a number of steps, or set config.init.checkpoint to "
        "only evaluate those weights.")


def check_choice(config: ml_collections.ConfigDict, field: str,
                 allowed: Iterable[str]):
  """`config.FIELD` (dotted) is one of `allowed`."""
  if _get(config, field) not in allowed:
    raise UserError(f"config.{field}={_get(config, field)!r} is not one of "
                    f"{', '.join(allowed)}.")
