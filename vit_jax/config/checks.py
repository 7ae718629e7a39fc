"""Every mistake in a training config that can be seen before compiling.

Each check raises a `UserError` that names the field, its value and what
to use instead, so a bad override costs seconds, not a compiled run.
"""

from typing import Optional

from absl import logging
from jax.sharding import Mesh
import ml_collections

from vit_jax import evaluators
from vit_jax import models
from vit_jax import sharding
from vit_jax.config import imports
from vit_jax.data import input_pipeline
from vit_jax.data import preprocess
from vit_jax.errors import UserError
from vit_jax.fewshot import evaluator as fewshot_evaluator
from vit_jax.fewshot import solver as fewshot_solver
from vit_jax.models import masked_patch
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.weights import posemb

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
_CHOICES = (
    ("optimizer", optim.OPTIMIZERS),
    ("decay_type", optim.DECAY_TYPES),
    ("loss", steps.LOSSES),
    ("mu_dtype", optim.MOMENTUM_DTYPES),
    ("init.posemb_resize", posemb.METHODS),
    ("objective", steps.OBJECTIVES),
    ("masked_patch.target", masked_patch.TARGETS),
)


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


def _op_names(config: ml_collections.ConfigDict, spec: str) -> list[str]:
  """The op names of a pipeline, parsed (so checked) as the input will be."""
  ops = preprocess.parse(spec, config.image_size, config.pp_crop_antialias)
  return [op.name for op in ops]


def check_config(config: ml_collections.ConfigDict, mesh: Mesh,
                 process_count: Optional[int] = None):
  """Every user mistake we can see before compiling, with its fix
  (`process_count`: the processes that will run it, if not these)."""
  imports.load(config)  # What they register is checked below.
  check_numbers(config)
  models.check_model_config(config.model)
  train_ops = _op_names(config, config.pp_train)
  if ("randaug" in train_ops and "value_range" in train_ops and
      train_ops.index("randaug") > train_ops.index("value_range")):
    raise UserError(f"config.pp_train={config.pp_train!r} applies randaug "
                    "after value_range; RandAugment works on [0, 255] "
                    "pixels: put it before value_range.")
  evaluated = [("pp_eval", config.pp_eval),
               ("fewshot.pp_eval", config.fewshot.pp_eval)]
  evaluated += [(f"evals.{name}.data.pp", entry.data.pp)
                for name, entry in config.evals.items()]
  for field, spec in evaluated:
    if spec and "randaug" in _op_names(config, spec):
      raise UserError(f"config.{field}={spec!r} augments evaluation images "
                      "at random; randaug belongs in config.pp_train.")
  if config.mixup.alpha > 0 and config.objective != "supervised":
    raise UserError(f"config.mixup.alpha={config.mixup.alpha} mixes labels, "
                    f"which config.objective={config.objective!r} does not "
                    "read; set config.mixup.alpha=0.")
  for field, allowed in _CHOICES:
    if _get(config, field) not in allowed:
      raise UserError(f"config.{field}={_get(config, field)!r} is not one of "
                      f"{', '.join(allowed)}.")
  models.check_image_size(config.model.variant, config.image_size,
                          "config.image_size")
  stride = models.get_variant(config.model.variant).stride
  if config.objective == "masked_patch":
    check_masked_patch(config, stride)
  fewshot_solver.check_config(config.fewshot)
  fewshot_evaluator.dataset_splits(
      config.fewshot.datasets, config.fewshot.train_split,
      config.fewshot.eval_split, "config.fewshot.datasets")
  evaluators.check(config)
  sharding.check_strategy_rules(config.sharding.params)
  sharding.local_batch_size(config.batch_size, mesh, what="batch_size",
                            accumulation=config.accum_steps,
                            process_count=process_count, log=True)
  sharding.local_batch_size(config.eval_batch_size, mesh,
                            what="eval_batch_size", process_count=process_count)


def check_masked_patch(config: ml_collections.ConfigDict, stride: int):
  """The model (a plain ViT with nothing it cannot train), the rates, the
  colour bits, the patch grid and the pixel range that masked patch
  prediction needs."""
  mp = config.masked_patch
  if models.get_variant(config.model.variant).resnet is not None:
    raise UserError(
        f"config.objective=masked_patch does not take the hybrid "
        f"{config.model.variant}: its ResNet stem sees across patch borders, "
        "so a corrupted patch's pixels reach its neighbours' tokens (the "
        "paper pre-trains plain ViTs this way). Pick a plain ViT variant.")
  if config.model.classifier == "map" or config.model.representation_size:
    raise UserError(
        "config.model.classifier=map and config.model.representation_size "
        "add layers masked patch prediction never trains (weight decay would "
        "shrink them to zero); use classifier token or gap and no "
        "representation_size with config.objective=masked_patch.")
  if not 0.0 < mp.corrupt_rate <= 1.0:
    raise UserError(f"config.masked_patch.corrupt_rate={mp.corrupt_rate} "
                    "must be in (0, 1] (the paper: 0.5).")
  for field in ("mask_rate", "replace_rate"):
    if not 0.0 <= mp[field] <= 1.0:
      raise UserError(f"config.masked_patch.{field}={mp[field]} must be in "
                      "[0, 1].")
  if mp.mask_rate + mp.replace_rate > 1.0:
    raise UserError(
        f"config.masked_patch.mask_rate + replace_rate = "
        f"{mp.mask_rate + mp.replace_rate:g} exceeds 1; they are shares of the "
        "corrupted patches (the rest are kept), e.g. 0.8 and 0.1.")
  if not 1 <= mp.color_bits <= 5:
    raise UserError(f"config.masked_patch.color_bits={mp.color_bits} must be "
                    "in 1..5 (3 bits per channel: 512 colour classes).")
  if mp.target == "downsized" and (mp.downsized_size < 1 or
                                   stride % mp.downsized_size):
    raise UserError(
        f"config.masked_patch.downsized_size={mp.downsized_size} does not "
        f"divide the {stride}-pixel patches of {config.model.variant}; use a "
        f"divisor of {stride} (the paper: 4).")
  if (config.image_size // stride)**2 < 2:
    raise UserError(
        f"config.image_size={config.image_size} gives one patch; masked "
        "patch prediction needs at least two (a patch is replaced by "
        "another).")
  pipelines = [("pp_train", config.pp_train), ("pp_eval", config.pp_eval)]
  pipelines += [(f"evals.{name}.data.pp", entry.data.pp)
                for name, entry in config.evals.items()
                if entry.type == "masked_patch" and entry.data.pp]
  for field, spec in pipelines:
    if _op_names(config, spec)[-1:] != ["value_range"]:
      raise UserError(
          f"config.{field}={spec!r} must end with value_range: the "
          "colour targets of config.objective=masked_patch are read from "
          "pixels in [-1, 1].")


def check_labels(config: ml_collections.ConfigDict,
                 info: input_pipeline.DatasetInfo):
  """Supervised training needs labels; unlabelled data is for masked_patch."""
  if config.objective == "supervised" and not info.num_classes:
    raise UserError(
        f"{config.dataset} has no labels, and config.objective=supervised "
        "learns from labels. Use --config.objective=masked_patch "
        "(self-supervised; configs/selfsup.py), or a labelled dataset.")


def warn_if_loss_mismatches_labels(config: ml_collections.ConfigDict,
                                   info: input_pipeline.DatasetInfo):
  if info.multi_label and config.loss == "softmax_xent":
    logging.warning(
        "%s has several labels per image but config.loss=softmax_xent "
        "spreads one probability over them; use "
        "--config.loss=sigmoid_xent to score each label on its own.",
        config.dataset)
